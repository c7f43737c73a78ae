"""Small long-format panels written as shuffled multi-file Parquet, for the store tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def make_panel(
    seed: int = 0,
    num_entities: int = 40,
    length_range: tuple[int, int] = (5, 60),
    num_strata: int = 3,
    times: str = "gaps",
) -> pa.Table:
    """A panel with columns entity (str), t (int64), a (float64), b (int32), y (float32),
    kind (str stratum), cls (int label), one row per (entity, t), in random row order.

    `times`: "gaps" (random increasing times), "steps" (consecutive integers from a
    random start), "strided" (every 7th integer), or "mixed" (entity by entity, one of
    the three, plus some like 0, 2, 3, 6 that look like a progression but are not)."""
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(num_entities):
        length = int(rng.integers(*length_range))
        kind = times if times != "mixed" else ["gaps", "steps", "strided", "fake"][i % 4]
        start = int(rng.integers(-50, 50))
        if kind == "steps":
            entity_times = start + np.arange(length, dtype=np.int64)
        elif kind == "strided":
            entity_times = start + 7 * np.arange(length, dtype=np.int64)
        elif kind == "fake":  # count fits span/step but the times are not a progression
            entity_times = start + 2 * np.arange(length, dtype=np.int64)
            entity_times[1:-1] += 1
        else:
            entity_times = np.sort(rng.choice(10 * length, size=length, replace=False))
        entity_times = entity_times.astype(np.int64)
        parts.append(
            {
                "entity": np.full(length, f"ent{i:03d}"),
                "t": entity_times,
                "a": rng.normal(i, 1 + i % 7, length),
                "b": rng.integers(-5, 50, length).astype(np.int32),
                "y": (rng.normal(size=length) * (i + 1)).astype(np.float32),
                "kind": np.full(length, f"kind{i % num_strata}"),
                "cls": np.full(length, i % 2, dtype=np.int64),
            }
        )
    columns = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    order = rng.permutation(len(columns["t"]))
    return pa.table({key: value[order] for key, value in columns.items()})


def write_files(table: pa.Table, directory: Path, num_files: int = 3, seed: int = 0) -> Path:
    """Writes `table` as `num_files` Parquet files of unequal sizes, spreading every
    entity's rows over several files; small row groups so batches cross them."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, table.num_rows), size=num_files - 1, replace=False))
    bounds = [0, *cuts.tolist(), table.num_rows]
    for k in range(num_files):
        part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
        pq.write_table(part, directory / f"part-{k}.parquet", row_group_size=97)
    return directory


def columns_of(table: pa.Table, names: list[str]) -> np.ndarray:
    """`[N, C]` float64 of the named columns."""
    return np.stack([table[name].to_numpy().astype(np.float64) for name in names], axis=1)
