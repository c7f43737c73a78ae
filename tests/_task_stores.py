"""Small real stores for the task, partitioner and loader tests (Parquet → ingest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TIME_ORIGIN = 1000
TIME_STEP = 3


def write_encoded_panel(path: Path, lengths: list[int]) -> Path:
    """A Parquet panel whose values encode (entity, time), rows shuffled.

    Entity e (id f"e{e:03d}") has `lengths[e]` rows at times TIME_ORIGIN + TIME_STEP*i;
    columns: `code` = e*10000 + i, `time_copy` = the row's time, `target` = the time plus
    0.5; stratum "s{e % 3}", label "c{e % 4}".
    """
    entity = np.concatenate([np.full(n, e) for e, n in enumerate(lengths)])
    step = np.concatenate([np.arange(n) for n in lengths])
    times = TIME_ORIGIN + TIME_STEP * step
    order = np.random.default_rng(0).permutation(len(entity))
    table = pa.table(
        {
            "entity": pa.array([f"e{e:03d}" for e in entity[order]]),
            "t": pa.array(times[order], pa.int64()),
            "code": pa.array((entity * 10000 + step)[order].astype(np.float64)),
            "time_copy": pa.array(times[order].astype(np.float64)),
            "target": pa.array(times[order] + 0.5),
            "group": pa.array([f"s{e % 3}" for e in entity[order]]),
            "cls": pa.array([f"c{e % 4}" for e in entity[order]]),
        }
    )
    pq.write_table(table, path)
    return path


def build_encoded_store(directory: Path, lengths: list[int]):
    from metadist.store import ingest

    source = write_encoded_panel(directory / "panel.parquet", lengths)
    return ingest(
        source,
        directory / "store",
        entity_col="entity",
        time_col="t",
        features=["code", "time_copy"],
        targets=["target"],
        stratum_col="group",
        label_col="cls",
        scaling="none",
        progress=False,
    )


# 36 entities of 40..400 rows, plus two too short for the default forecast tasks.
PANEL_LENGTHS = [40 + (37 * e) % 361 for e in range(36)] + [12, 20]
