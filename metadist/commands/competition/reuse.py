"""An evaluation done again on the same inputs is read back, not redone.

A validation run made again in its output (another `--experiment-margin`, a candidate
added, a run stopped during its evaluations) evaluates every candidate again: 16 and 28
minutes on M1 and M3 here, for the same figures. Each evaluation of a competition run
records a digest of what it reads (`inputs_digest`) in `<run>/eval/inputs.json`: its
settings (the overrides: the labels, periods, holdout, ensemble, ...), the files of every
member run (checkpoints, the best-checkpoint pointer, the config, the periods), the
files of the store and the holdout, and the code (the package's files, the experiment
configs, torch's and numpy's versions). Large files count by size and time of writing,
small ones by their bytes. Where the digest is the same and the report files are there,
the evaluation is read back (and says so); anything changed evaluates again. The record
goes before an evaluation starts and is written after it ends, so an evaluation that
failed half-way is never read back.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from metadist.configs import PACKAGE, find_experiments_dir
from metadist.durable import atomic_write_text
from metadist.eval.report import EVAL_DIR, FORECASTS_NAME, JSON_NAME, TASKS_NAME

INPUTS_FILE = "inputs.json"
# files up to this size count by their bytes, larger ones by size and time of writing
_SMALL = 1 << 16
# a run's files an evaluation reads
_RUN_FILES = ("best.json", "config.yaml", "periods.json")


def inputs_digest(run_dirs: Sequence[Path], files: Sequence[Path], overrides: Sequence[str]) -> str:
    """The digest of an evaluation of the member runs `run_dirs` (the evaluated one
    first) reading `files` (the store's directory, the holdout) with `overrides`."""
    digest = hashlib.sha256(json.dumps([str(o) for o in overrides]).encode())
    digest.update(_code_digest().encode())
    for run in run_dirs:
        digest.update(str(run).encode())
        for path in [run / name for name in _RUN_FILES] + _files(run / "checkpoints"):
            digest.update(_file_digest(path).encode())
    for path in files:
        for item in _files(path) if path.is_dir() else [path]:
            digest.update(_file_digest(item).encode())
    return digest.hexdigest()


def evaluated_before(run_dir: Path, digest: str) -> bool:
    """Whether `run_dir`'s evaluation recorded `digest` and its report files are there;
    where it is not, the record goes (the evaluation about to run replaces it)."""
    eval_dir = run_dir / EVAL_DIR
    record = eval_dir / INPUTS_FILE
    try:
        recorded = json.loads(record.read_text(encoding="utf-8")).get("digest")
    except (OSError, ValueError, AttributeError):
        recorded = None
    reports = all((eval_dir / name).is_file() for name in (JSON_NAME, TASKS_NAME, FORECASTS_NAME))
    if recorded == digest and reports:
        return True
    record.unlink(missing_ok=True)
    return False


def record_inputs(run_dir: Path, digest: str) -> None:
    """Records that `run_dir`'s evaluation, just written, read the inputs of `digest`."""
    atomic_write_text(run_dir / EVAL_DIR / INPUTS_FILE, json.dumps({"digest": digest}) + "\n")


def _files(directory: Path) -> list[Path]:
    """Every file under `directory`, in order (none where it does not exist)."""
    return sorted(p for p in directory.rglob("*") if p.is_file()) if directory.is_dir() else []


def _file_digest(path: Path) -> str:
    """A file's name with its bytes' digest (small files) or its size and time of
    writing (large ones); `-` where it does not exist."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return f"{path}:-"
    if stat.st_size <= _SMALL:
        return f"{path}:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


@functools.cache
def _code_digest() -> str:
    """The digest of the code an evaluation runs: the package's files, the experiment
    configs, torch's and numpy's versions."""
    digest = hashlib.sha256(f"{torch.__version__} {np.__version__}".encode())
    roots = [PACKAGE]
    with contextlib.suppress(FileNotFoundError):  # the evaluation will say so
        roots.append(find_experiments_dir())
    for root in roots:
        for path in _files(root):
            if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()
