"""Whether a run is a member of a `metadist competition` output.

A competition writes its runs at `OUT/hH/NAME` (one directory per horizon group) beside
its marker `OUT/competition-output.json`; it evaluates them under its own protocol (each
group's series, the holdout, the data set's seasonal periods and metric), which a plain
`metadist eval` of one member does not repeat, and `Run.forecast` cuts new histories as
that protocol's holdout evaluation does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# the marker of a competition output: which training file, which protocol
OUTPUT_FILE = "competition-output.json"
MARKER_KIND = "metadist competition output"


def competition_of(run_dir: str | os.PathLike) -> Path | None:
    """The competition output `run_dir` belongs to (`OUT` of `OUT/hH/NAME`, holding
    the marker `OUTPUT_FILE`); None for any other run."""
    out = Path(run_dir).resolve().parent.parent
    marker = out / OUTPUT_FILE
    try:
        document = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("kind") != MARKER_KIND:
        return None
    return out


def rescore_hint(out: Path) -> str:
    """How to re-score the runs of the competition output `out` under its protocol:
    `metadist competition DATA_DIR --out OUT` (with `--validation` for a validation
    output; DATA_DIR from the marker, else a placeholder)."""
    try:
        document = json.loads((out / OUTPUT_FILE).read_text())
    except (OSError, ValueError):
        document = {}
    data = document.get("data") if isinstance(document, dict) else None
    data_dir = str(Path(data).parent) if data else "DATA_DIR"
    validation = " --validation" if document.get("protocol") == "validation" else ""
    return f"metadist competition {data_dir}{validation} --out {out}"
