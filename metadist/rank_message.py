"""A training rank's one-line error, left for the launcher that started it.

Under torchrun an error every rank meets alike is printed once, by local rank 0; the
other ranks stay quiet. An error that a rank other than 0 meets alone (before its
meta-steps: its own environment, a component of the user's that fails there) was then
said by no one, and torchrun's line pointed at a message that was not there. So every
rank leaves its line in the error file torchrun gives it (`TORCHELASTIC_ERROR_FILE`, in
the format torch's own `ErrorHandler` writes), saying whether it printed it; the
launcher (`metadist.launch.torchrun`) prints the first failed rank's line, naming it,
where no rank printed it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

_KEY = "metadist"


def leave_line(line: str, *, said: bool, prog: str) -> None:
    """Leaves this rank's error `line` for its launcher, `said` where this rank printed
    it; nothing where no launcher asked for it (or the file cannot be written)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    extra = {"line": line, "said": said, "prog": prog}
    data = {
        "message": {
            "message": line,
            "extraInfo": {"timestamp": str(int(time.time())), _KEY: extra},
        }
    }
    try:
        with open(path, "w") as file:
            json.dump(data, file)
    except OSError:
        pass  # the launcher then says what it can (the rank's exit status)


def unsaid_line(failures: dict[int, Any], rank: int) -> str | None:
    """`PROG: error: on rank N: LINE` where the failed rank `rank` left a line no rank
    printed (no other rank printed the same line), else None.

    Args:
        failures: torchrun's failures by global rank (each has `error_file_data`).
        rank: the rank whose failure the launcher reports.
    """
    left = {r: _left(failure) for r, failure in failures.items()}
    own = left.get(rank)
    if own is None or own["said"]:
        return None
    if any(other and other["said"] and other["line"] == own["line"] for other in left.values()):
        return None
    return f"{own['prog']}: error: on rank {rank}: {own['line']}"


def _left(failure: Any) -> dict[str, Any] | None:
    data = getattr(failure, "error_file_data", None)
    message = data.get("message") if isinstance(data, dict) else None
    extra = message.get("extraInfo") if isinstance(message, dict) else None
    left = extra.get(_KEY) if isinstance(extra, dict) else None
    if isinstance(left, dict) and isinstance(left.get("line"), str):
        return left
    return None
