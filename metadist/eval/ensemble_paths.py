"""Where the ensemble members a run's own evaluation settings name (`eval.ensemble`) are
now.

A member's path in the settings a run saved was written from the directory the run was
trained from: relative to it, as the run's own `run_dir` is. A run copied or moved
elsewhere together with its members (a whole project directory, a tar.gz unpacked on
another machine) keeps that layout, so the member is found from where the run now is,
as its store is (`metadist.train.artifact`), not from the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def trained_from(run_dir: str | os.PathLike, recorded_run_dir: str | os.PathLike) -> Path | None:
    """The directory the run at `run_dir` was trained from, as seen from here: `run_dir`
    less as many trailing parts as its config's relative `run_dir` has (`runs/a`, the
    config's, of `/copy/runs/a` was trained from `/copy`). None where the config's is
    absolute or climbs (`..`): it then says nothing of the layout."""
    recorded = Path(os.path.normpath(recorded_run_dir))
    if recorded.is_absolute() or ".." in recorded.parts or recorded == Path("."):
        return None
    return Path(os.path.normpath(Path(run_dir, *[".."] * len(recorded.parts))))


def members_from_run(
    run_dir: str | os.PathLike, recorded_run_dir: str | os.PathLike, members: list[str]
) -> list[str]:
    """`members` (the run's recorded `eval.ensemble`) as paths from the working
    directory: a relative one from the directory the run was trained from
    (`trained_from`; through a link to the run directory, also from where it points)
    where a run directory is there; any other is kept as written (an unchanged path
    where the run was not moved, so the settings read the same)."""
    # through a link to the run directory: also from where the link points
    roots = [trained_from(run_dir, recorded_run_dir)]
    roots.append(trained_from(Path(run_dir).resolve(), recorded_run_dir))
    found = []
    for member in members:
        places = [Path(os.path.normpath(root / member)) for root in roots if root is not None]
        there = next((place for place in places if place.is_dir()), None)
        if Path(member).is_absolute() or there is None:
            found.append(member)
        elif Path(member).is_dir() and Path(member).samefile(there):
            found.append(member)  # where the run was not moved: the settings read the same
        else:
            found.append(str(there))
    return found
