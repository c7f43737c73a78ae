"""Reading a running trial's meta-val metric back from its `metrics.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path


def read_val_metric(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """`(step, value)` of every meta-val record of a run's `metrics.jsonl`, in order.

    A line being written (no newline yet) is skipped; a non-finite value reads as NaN.

    Raises:
        ValueError: a val record lacks `metric` (the message lists the keys it has).
    """
    path = run_dir / "metrics.jsonl"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    points: list[tuple[int, float]] = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("split") != "val":
            continue
        if metric not in record:
            keys = sorted(k for k in record if k not in ("step", "split", "time"))
            raise ValueError(f"--metric {metric!r} is not in the val records of {path}: {keys}")
        try:
            value = float(record[metric])
        except (TypeError, ValueError):
            value = float("nan")
        points.append((int(record["step"]), value))
    return points
