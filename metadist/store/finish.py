"""The last files of a store: the entity index, per-entity statistics and metadata."""

from __future__ import annotations

import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from metadist.durable import fsync_path
from metadist.store import sources
from metadist.store.arrow import int64_array, string_array
from metadist.store.format import (
    CHECKSUM_ALGORITHM,
    ENTITY_STATS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_FILE,
    METADATA_FILE,
    write_json,
)
from metadist.store.plan import IngestPlan
from metadist.store.settings import IngestSettings

_MAX_DROPPED_LISTED = 1000


def write_index_and_metadata(
    settings: IngestSettings,
    plan: IngestPlan,
    temp: Path,
    src: str | Path,
    checksums: dict[str, str],
    timings: dict[str, float],
) -> None:
    """Writes and fsyncs `index.arrow`, `entity_stats.npz` and `metadata.json` (last:
    its presence marks a whole store), then the directory."""
    index = pa.table(
        {
            "entity_id": string_array(plan.entity_ids),
            "start": int64_array(plan.starts),
            "length": int64_array(plan.lengths),
            "stratum": string_array(plan.category_of["stratum"].tolist()),
            "label": string_array(plan.category_of["label"].tolist()),
        }
    )
    with (
        pa.OSFile(str(temp / INDEX_FILE), "wb") as sink,
        pa.ipc.new_file(sink, index.schema) as writer,
    ):
        writer.write_table(index)
    fsync_path(temp / INDEX_FILE)
    with open(temp / ENTITY_STATS_FILE, "wb") as handle:
        np.savez(
            handle,
            count=plan.entity_count.astype(np.int64),
            mean=plan.entity_mean,
            m2=plan.entity_m2,
            std=plan.entity_std,
        )
        handle.flush()
        os.fsync(handle.fileno())
    write_json(temp / METADATA_FILE, metadata(settings, plan, src, checksums, timings))
    fsync_path(temp)


def metadata(
    settings: IngestSettings,
    plan: IngestPlan,
    src: str | Path,
    checksums: dict[str, str],
    timings: dict[str, float],
) -> dict[str, Any]:
    columns = settings.columns
    # per stratum, in the order the strata first come in the store
    names, first, inverse = np.unique(
        np.asarray(plan.category_of["stratum"]).astype(str), return_index=True, return_inverse=True
    )
    entities = np.bincount(inverse, minlength=len(names))
    rows = np.bincount(inverse, weights=plan.lengths, minlength=len(names))
    strata = {
        str(names[k]): {"entities": int(entities[k]), "rows": int(rows[k])}
        for k in np.argsort(first, kind="stable")
    }
    reasons = Counter(kind for _, (kind, _) in plan.dropped)
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "feature_names": list(columns.features),
        "target_names": list(columns.targets),
        "column_names": list(settings.value_names),
        "entity_col": columns.entity,
        "time_col": columns.time,
        "time_kind": settings.time_kind,
        "stratum_col": columns.stratum,
        "label_col": columns.label,
        "num_entities": len(plan.order),
        "num_rows": plan.num_rows,
        "nan_policy": settings.nan,
        "min_length": settings.min_length,
        "scaling": {
            "kind": settings.scaling,
            "count": plan.global_count.astype(np.int64).tolist(),
            "mean": plan.global_mean.tolist(),
            "m2": plan.global_m2.tolist(),
            "std": plan.global_std.tolist(),
            "entity_stats": ENTITY_STATS_FILE,
        },
        "source": {
            "path": str(src),
            "fingerprint": sources.fingerprint(list(settings.files)),
            "num_files": len(settings.files),
            "num_rows_read": settings.num_rows_read,
        },
        "checksum_algorithm": CHECKSUM_ALGORITHM,
        "checksums": checksums,
        "strata": strata,
        "dropped": {
            "num_entities": len(plan.dropped),
            "reasons": dict(reasons),
            "entities": [
                {"entity_id": str(key), "reason": reason}
                for key, (_, reason) in plan.dropped[:_MAX_DROPPED_LISTED]
            ],
        },
        "timings_s": {key: round(value, 3) for key, value in timings.items()},
    }
