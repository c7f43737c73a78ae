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

from metadist.durable import atomic_write_text

# the marker of a competition output: which training file, which protocol
OUTPUT_FILE = "competition-output.json"
MARKER_KIND = "metadist competition output"
# the marker in each member run: it stays a member's wherever the run is copied
MEMBER_FILE = "competition-member.json"
MEMBER_KIND = "metadist competition member"


def mark_member(run_dir: Path, out: Path) -> None:
    """Marks `run_dir` as a member of the competition output `out` (`MEMBER_FILE`), so
    that a copy of the run elsewhere still forecasts as the competition's protocol does."""
    text = json.dumps({"kind": MEMBER_KIND, "output": str(Path(out).resolve())}) + "\n"
    path = Path(run_dir) / MEMBER_FILE
    if not (path.is_file() and path.read_text() == text):
        atomic_write_text(path, text)


def is_competition_member(run_dir: str | os.PathLike) -> bool:
    """Whether `run_dir` was made by `metadist competition`: its own marker, or (a run
    made before members were marked) an output's marker two directories up."""
    try:
        document = json.loads((Path(run_dir) / MEMBER_FILE).read_text())
    except (OSError, ValueError):
        document = None
    if isinstance(document, dict) and document.get("kind") == MEMBER_KIND:
        return True
    return competition_of(run_dir) is not None


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
        document = None
    if not isinstance(document, dict):  # a marker edited or damaged: the placeholders
        document = {}
    data = document.get("data")
    data_dir = str(Path(data).parent) if isinstance(data, str) and data else "DATA_DIR"
    validation = " --validation" if document.get("protocol") == "validation" else ""
    return f"metadist competition {data_dir}{validation} --out {out}"
