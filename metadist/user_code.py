"""Where an error came from in the user's own code, for the one-line messages that name it."""

from __future__ import annotations

import contextlib
import site
import sysconfig
import traceback
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent)


def _library_roots() -> tuple[str, ...]:
    """The standard library's and every installed-package directory (platform, user
    and distribution site-packages too)."""
    paths = sysconfig.get_paths()
    roots = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    with contextlib.suppress(AttributeError):  # an old virtualenv's `site` lacks them
        roots += [*site.getsitepackages(), site.getusersitepackages()]
    return tuple(sorted({str(Path(root).resolve()) for root in roots if root}))


_LIBRARIES = _library_roots()


def user_code_location(error: BaseException, *, installed: bool = True) -> str:
    """` (at FILE:LINE)`: where `error` was raised in the user's code, or `""`.

    A `SyntaxError` names its own file and line. Otherwise the innermost frame of the
    traceback outside metadist, the import machinery, the standard library and installed
    packages (an error numpy or json raised from the user's code names the user's line);
    with `installed` (a module of the user's may be an installed package), where there
    is none, the innermost frame outside metadist and the import machinery.
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
    own = [frame for frame in frames if not _under(frame.filename, _LIBRARIES)]
    frames = own if own or not installed else frames
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _under(filename: str, roots: tuple[str, ...]) -> bool:
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return any(path == root or path.startswith(root + "/") for root in roots)


def user_error_line(error: BaseException) -> str | None:
    """`TYPE: MESSAGE (at FILE:LINE)` for an error raised in the user's own code (a
    sampler, model or learner of theirs), for a command's one-line report; `None` for one
    of metadist's own, whose traceback is the report."""
    where = user_code_location(error, installed=False)
    return f"{type(error).__name__}: {error}{where}" if where else None
