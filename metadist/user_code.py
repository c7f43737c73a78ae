"""Where an error came from in the user's own code, for the one-line messages that name it."""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent)
_LIBRARIES = tuple(
    sorted({str(Path(sysconfig.get_paths()[key]).resolve()) for key in ("stdlib", "purelib")})
)


def user_code_location(error: BaseException, *, installed: bool = True) -> str:
    """` (at FILE:LINE)`: where `error` was raised in the user's code, or `""`.

    A `SyntaxError` names its own file and line. Otherwise the innermost frame of the
    traceback outside metadist and the import machinery; with `installed=False`, also
    outside the standard library and installed packages (an error numpy or torch raised
    from the user's code names the user's line, one raised from metadist's names none).
    """
    if isinstance(error, SyntaxError) and error.filename:
        return f" (at {error.filename}:{error.lineno})"
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not _under(frame.filename, (_PACKAGE,))
        and "importlib" not in frame.filename
        and not frame.filename.startswith("<")
    ]
    if not installed:
        frames = [frame for frame in frames if not _under(frame.filename, _LIBRARIES)]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _under(filename: str, roots: tuple[str, ...]) -> bool:
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return any(path == root or path.startswith(root + "/") for root in roots)
