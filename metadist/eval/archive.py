"""Evaluations of a run kept side by side: `<run_dir>/eval/` holds the latest, and an
earlier one with other settings moves to `<run_dir>/eval/<its key>/`.

An evaluation's key names the checkpoint it scored and a hash of its settings, e.g.
`step_00000003-1a2b3c4d`; `metrics.json` records it (`evaluation`). Before an evaluation
is written, the one in `eval/` moves aside when its key differs (one written before keys
were recorded moves to `eval/earlier-<its time>/`), so `eval/metrics.json` is always the
latest evaluation and none is overwritten. The same key again replaces the files in
place: the same evaluation, done again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from metadist.durable import fsync_path
from metadist.eval.report import (
    EVAL_DIR,
    FIGURE_NAME,
    FORECASTS_NAME,
    JSON_NAME,
    MARKDOWN_NAME,
    TASKS_NAME,
)

REPORT_FILES = (JSON_NAME, MARKDOWN_NAME, TASKS_NAME, FORECASTS_NAME, FIGURE_NAME)
KEY_FIELD = "evaluation"


def evaluation_key(checkpoint: str, options: Any) -> str:
    """`<checkpoint stem>-<8 hex digits of the settings' hash>`.

    Args:
        checkpoint: the scored checkpoint's file name.
        options: the evaluation settings (an `EvalOptions`).
    """
    settings = json.dumps(dataclasses.asdict(options), sort_keys=True, default=str)
    digest = hashlib.sha256(settings.encode()).hexdigest()[:8]
    return f"{Path(checkpoint).stem}-{digest}"


def keep_previous_evaluation(
    run_dir: str | os.PathLike, result: dict[str, Any], options: Any, checkpoint: str
) -> dict[str, str]:
    """Records the evaluation's key in `result` and moves the run's previous evaluation
    aside when it has another key.

    Returns:
        `{"previous evaluation": directory}` where one was moved, else `{}` (to add to
        the paths an evaluation reports).
    """
    key = evaluation_key(checkpoint, options)
    result[KEY_FIELD] = key
    eval_dir = Path(run_dir) / EVAL_DIR
    summary = eval_dir / JSON_NAME
    if not summary.is_file():
        return {}
    try:
        previous = json.loads(summary.read_text(encoding="utf-8")).get(KEY_FIELD)
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous == key:
        return {}
    if not isinstance(previous, str) or not previous or "/" in previous:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(summary.stat().st_mtime))
        previous = f"earlier-{stamp}"
    target = _free(eval_dir / previous)
    target.mkdir()
    for name in REPORT_FILES:
        if (eval_dir / name).exists():
            os.replace(eval_dir / name, target / name)
    fsync_path(target)
    fsync_path(eval_dir)
    return {"previous evaluation": str(target)}


def _free(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`, ... where it is taken."""
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}-{number}")
    return candidate
