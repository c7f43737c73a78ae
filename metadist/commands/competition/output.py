"""Where a competition writes: `--out` (or `runs/NAME`) is a new or empty directory, or
an earlier output of this command for the same training file and protocol, known by its
marker file (`OUTPUT_FILE`). Anything else (a data directory, a home directory, a
`--out ../x/..` that resolves to one) is refused before anything is written there."""

from __future__ import annotations

import json
import os
from pathlib import Path

from metadist.commands.competition.sources import file_fingerprint, recorded_fingerprint
from metadist.commands.competition.spec import SOURCE_FILE, VALIDATION_DIR
from metadist.durable import atomic_write_json
from metadist.eval.competition_member import MARKER_KIND as _KIND
from metadist.eval.competition_member import OUTPUT_FILE

__all__ = ["OUTPUT_FILE", "check_adaptation_source", "check_output", "claim_output"]


def check_output(out: Path, train: Path, validation: bool) -> None:
    """Refuses `out` unless it is absent, an empty directory, or a competition output
    of `train` under the same protocol (its marker, or an output of an earlier version
    whose store or validation split records `train` as it is now).

    Raises:
        ValueError: one line naming `--out` and what is there.
    """
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    try:
        entries = next(os.scandir(out), None)
    except OSError as error:
        raise ValueError(f"--out {out} cannot be read ({error.strerror})") from None
    if entries is None:
        return
    marker = out / OUTPUT_FILE
    if not marker.is_file():
        if _earlier_output(out, train, validation):
            return
        raise ValueError(
            f"--out {out} is a non-empty directory that is not an output of metadist "
            f"competition (it has no {OUTPUT_FILE}); give a new or empty directory"
        )
    recorded = _read_marker(marker, f"--out {out}", "; give another --out")
    wanted = _marker(train, validation)
    if recorded.get("data") != wanted["data"]:
        raise ValueError(
            f"--out {out} is the competition output of {recorded.get('data')}, not of "
            f"{wanted['data']}; give another --out"
        )
    if recorded.get("protocol") != wanted["protocol"]:
        raise ValueError(
            f"--out {out} is the output of a {recorded.get('protocol')} run, this is a "
            f"{wanted['protocol']} run; give another --out"
        )


def check_adaptation_source(val_out: Path, train: Path) -> None:
    """Refuses `--adaptation-from val_out` where its marker says it is the output of
    another training file than `train` (another data set's validation run): its
    choices were made on other series. An output without a marker (an earlier version's)
    is left to the adaptation file's own checks.

    Raises:
        ValueError: one line naming both training files.
    """
    marker = val_out / OUTPUT_FILE
    if not marker.is_file():
        return
    document = _read_marker(marker, f"--adaptation-from {val_out}")
    wanted = _marker(train, validation=True)["data"]
    if document.get("data") != wanted:
        raise ValueError(
            f"--adaptation-from {val_out} is the output of {document.get('data')}, not of "
            f"{wanted}: give the validation run of this data set (metadist competition "
            "DATA_DIR --validation)"
        )


def claim_output(out: Path, train: Path, validation: bool) -> None:
    """Creates `out` (checked by `check_output`) and writes its marker if it has none.

    Raises:
        ValueError: `out` cannot be made (naming `--out` and why).
    """
    check_output(out, train, validation)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not (out / OUTPUT_FILE).is_file():
            atomic_write_json(out / OUTPUT_FILE, _marker(train, validation))
    except OSError as error:
        raise ValueError(f"--out {out} cannot be written ({error.strerror})") from None


def _marker(train: Path, validation: bool) -> dict[str, str]:
    return {
        "kind": _KIND,
        "data": str(train.resolve()),
        "protocol": "validation" if validation else "test",
    }


def _read_marker(marker: Path, option: str, hint: str = "") -> dict[str, str]:
    """The marker's fields; one line naming `option` (the argument that led to it) where
    it is not a marker this command writes."""
    try:
        document = json.loads(marker.read_text())
    except (OSError, ValueError):
        document = None
    if not isinstance(document, dict) or document.get("kind") != _KIND:
        raise ValueError(
            f"{option}: {OUTPUT_FILE} there is not the marker metadist competition writes{hint}"
        )
    return {str(k): str(v) for k, v in document.items()}


def _earlier_output(out: Path, train: Path, validation: bool) -> bool:
    """Whether `out`, without a marker, is an output an earlier version wrote for
    `train` as it is now: under the validation protocol its split records that file,
    else its store does."""
    if not train.is_file():
        return False
    if validation:
        recorded = recorded_fingerprint(out / VALIDATION_DIR / SOURCE_FILE)
    else:
        recorded = recorded_fingerprint(out / "store" / "metadata.json", "source")
    return recorded is not None and recorded == file_fingerprint(train)
