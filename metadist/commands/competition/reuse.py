"""An evaluation done again on the same inputs is read back, not redone.

A validation run made again in its output (another `--experiment-margin`, a candidate
added, a run stopped during its evaluations) evaluated every candidate again: 4 minutes
for M1's 84 on an idle machine here, for the same figures. Each evaluation of a
competition run records a digest of what it reads (`inputs_digest`) in
`<run>/eval/inputs.json`, with the digest of the report it wrote:
- its settings (the overrides: the labels, periods, holdout, ensemble, ...), and every
  file an override names;
- the files of every member run (checkpoints and their pointers, the best-checkpoint
  record, the config, the periods), of the store and the holdout;
- the code and where it runs (`CODE_DIGEST`: the package's files and the experiment
  configs as they were when the process started, the versions of Python, torch, numpy,
  pandas, pyarrow and statsforecast, CUDA's availability, `OMP_NUM_THREADS`).

Small files count by their bytes; large ones by size, inode and times of writing and of
change (which no copy sets). Where the digest is the same and the report files are the
ones recorded (their bytes), the evaluation is read back and says so; anything changed,
or a report another command wrote since (`metadist eval`, `metadist train`), evaluates
again, and so does `--evaluate-again`. The record goes before an evaluation starts and is
written after it ends, where the inputs did not change meanwhile, so an evaluation that
failed half-way, or read inputs that moved under it, is never read back.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from metadist.configs import PACKAGE, find_experiments_dir
from metadist.durable import atomic_write_text
from metadist.eval.report import EVAL_DIR, FORECASTS_NAME, JSON_NAME, TASKS_NAME

INPUTS_FILE = "inputs.json"
# the report files a read-back serves, each checked against its recorded bytes
REPORTS = (JSON_NAME, TASKS_NAME, FORECASTS_NAME)
# files up to this size count by their bytes, larger ones by their status
_SMALL = 1 << 16
# a run's files an evaluation reads, beside its checkpoints
_RUN_FILES = ("best.json", "config.yaml", "periods.json")
# libraries whose versions change an evaluation's figures, where installed
_LIBRARIES = ("pandas", "pyarrow", "statsforecast")


def inputs_digest(run_dirs: Sequence[Path], files: Sequence[Path], overrides: Sequence[str]) -> str:
    """The digest of an evaluation of the member runs `run_dirs` (the evaluated one
    first) reading `files` (the store's directory, the holdout) with `overrides`."""
    digest = hashlib.sha256(json.dumps([str(o) for o in overrides]).encode())
    digest.update(CODE_DIGEST.encode())
    for run in run_dirs:
        digest.update(str(run).encode())
        for path in [run / name for name in _RUN_FILES] + _files(run / "checkpoints"):
            digest.update(_file_digest(path).encode())
    for path in dict.fromkeys([*files, *_named_paths(overrides)]):  # the holdout is named twice
        for item in _files(path) if path.is_dir() else [path]:
            digest.update(_file_digest(item).encode())
    return digest.hexdigest()


def evaluated_before(run_dir: Path, digest: str) -> bool:
    """Whether `run_dir`'s evaluation recorded `digest` and its report files are the
    ones it wrote; where not, the record goes (the evaluation about to run replaces it)."""
    eval_dir = run_dir / EVAL_DIR
    record = eval_dir / INPUTS_FILE
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
        same = recorded["digest"] == digest and recorded["reports"] == _reports_digest(eval_dir)
    except (OSError, ValueError, KeyError, TypeError):
        same = False
    if not same:
        record.unlink(missing_ok=True)
    return same


def record_inputs(run_dir: Path, digest: str, now: Callable[[], str]) -> None:
    """Records that `run_dir`'s evaluation, just written, read the inputs of `digest`,
    where `now()` (the digest taken again) finds them unchanged."""
    if now() != digest:
        return
    eval_dir = run_dir / EVAL_DIR
    try:
        document = {"digest": digest, "reports": _reports_digest(eval_dir)}
    except FileNotFoundError:  # a report missing: nothing to read back
        return
    atomic_write_text(eval_dir / INPUTS_FILE, json.dumps(document) + "\n")


def forget_evaluations(out: Path) -> None:
    """Removes every record under `out` (`--evaluate-again`): each evaluation runs again."""
    for record in out.glob(f"h*/*/{EVAL_DIR}/{INPUTS_FILE}"):
        record.unlink(missing_ok=True)


def _reports_digest(eval_dir: Path) -> str:
    """The digest of the report files' bytes (FileNotFoundError where one is missing)."""
    digest = hashlib.sha256()
    for name in REPORTS:
        digest.update(hashlib.sha256((eval_dir / name).read_bytes()).digest())
    return digest.hexdigest()


def _named_paths(overrides: Sequence[str]) -> list[Path]:
    """The existing files the overrides' values name (a path, or paths within a JSON
    value; the ensemble's run directories are digested as runs)."""
    found: list[Path] = []
    for override in overrides:
        _, _, value = str(override).partition("=")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        stack = [parsed]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, str) and item and os.path.isfile(item):
                found.append(Path(item))
    return found


def _files(directory: Path) -> list[Path]:
    """Every file and link under `directory`, in order (none where it does not exist)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_symlink() or p.is_file())


def _file_digest(path: Path) -> str:
    """A file's name with its bytes' digest (small files) or its size, inode and times
    of writing and change (large ones); a link's target too; `-` where there is none."""
    link = f"->{os.readlink(path)}" if path.is_symlink() else ""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return f"{path}{link}:-"
    if stat.st_size <= _SMALL:
        return f"{path}{link}:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    return f"{path}{link}:{stat.st_size}:{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_ctime_ns}"


def _code_digest() -> str:
    """The digest of the code an evaluation runs and where: the package's files, the
    experiment configs, the libraries' versions, CUDA's availability, the threads."""
    versions = [sys.version, torch.__version__, np.__version__, str(torch.version.cuda)]
    for name in _LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(f"{name} {importlib.metadata.version(name)}")
    versions += [str(torch.cuda.is_available()), os.environ.get("OMP_NUM_THREADS", "")]
    digest = hashlib.sha256(json.dumps(versions).encode())
    roots = [PACKAGE]
    with contextlib.suppress(FileNotFoundError):  # the evaluation will say so
        roots.append(find_experiments_dir())
    for root in roots:
        for path in _files(root):
            if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


# taken when the process starts: the code it runs, whatever is edited while it trains
CODE_DIGEST = _code_digest()
