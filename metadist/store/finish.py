"""The last files of a store: the entity index, per-entity statistics and metadata; and
the disk space a store needs (`store_bytes`, every file it writes)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadist.durable import fsync_path
from metadist.store import sources
from metadist.store.arrow import int64_array, string_array
from metadist.store.format import (
    CHECKSUM_ALGORITHM,
    ENTITY_STATS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_FILE,
    METADATA_CHECKSUM,
    METADATA_FILE,
    TIMES_DTYPE,
    VALUES_DTYPE,
    file_checksum,
    metadata_checksum,
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
    its presence marks a whole store; it records the checksums of the other files, and
    of its own other fields), then the directory."""
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
    # recorded with those of values.bin and times.bin, so `metadist verify` finds these
    # files changed too (a valid archive holding other numbers passes every other check)
    checksums = {
        **checksums,
        INDEX_FILE: file_checksum(temp / INDEX_FILE),
        ENTITY_STATS_FILE: file_checksum(temp / ENTITY_STATS_FILE),
    }
    recorded = metadata(settings, plan, src, checksums, timings)
    recorded[METADATA_CHECKSUM] = metadata_checksum(recorded)
    write_json(temp / METADATA_FILE, recorded)
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


# ---------------------------------------------------------------- the store's size
_FIXED_BYTES = 4 << 10  # metadata.json, the Arrow and zip headers and footers


def store_bytes(
    num_rows: int, num_columns: int, num_entities: int, entity_bytes: float = 0.0
) -> int:
    """About the disk space an ingest needs: every file of the store, and the map of
    filled slots that pass 2 keeps beside them until it is done.

    Args:
        num_rows: rows read from the input (an upper bound of the rows kept).
        num_columns: C, the value columns.
        num_entities: E, the entities.
        entity_bytes: mean bytes of an entity's id, stratum and label as UTF-8.
    """
    rows = num_rows * (VALUES_DTYPE.itemsize * num_columns + TIMES_DTYPE.itemsize + 1)
    # entity_stats.npz: count, mean, m2, std, each [E, C] 8 bytes; index.arrow: start and
    # length (8 bytes each) and three strings (4-byte offsets and their UTF-8 bytes)
    entities = num_entities * (4 * 8 * num_columns + 2 * 8 + 3 * 4 + entity_bytes)
    return int(rows + entities + _FIXED_BYTES)


def estimated_store_bytes(files: Sequence[sources.SourceFile], columns: sources.Columns) -> int:
    """`store_bytes` of an ingest of `files`, its entities counted by reading the
    entity, stratum and label columns (a fraction of the input: call it when the figure
    is needed, e.g. in the message of a full disk).

    Raises:
        ValueError: an input file cannot be read.
    """
    names = [n for n in (columns.entity, columns.stratum, columns.label) if n is not None]
    ids: list[pa.Array] = []
    num_ids = 0
    category_bytes = num_rows = 0
    for file in files:
        parquet = sources.open_parquet(file.path)
        for batch in parquet.iter_batches(columns=names, batch_size=1 << 16):
            num_rows += batch.num_rows
            ids.append(pc.unique(_decoded(batch.column(0))))
            num_ids += len(ids[-1])
            if num_ids > 4 * len(ids[0]) + (1 << 20):  # bounded: merge what was found
                ids = [pc.unique(pa.concat_arrays(ids))]
                num_ids = len(ids[0])
            for k in range(1, batch.num_columns):
                category_bytes += _utf8_bytes(_decoded(batch.column(k)))
    unique = pc.unique(pa.concat_arrays(ids)) if ids else pa.array([], pa.string())
    num_entities = len(unique)
    entity_bytes = _utf8_bytes(unique) / max(num_entities, 1)
    entity_bytes += category_bytes / max(num_rows, 1)  # constant within an entity
    total_rows = sum(f.num_rows for f in files)
    return store_bytes(total_rows, len(columns.value_columns), num_entities, entity_bytes)


def _decoded(column: pa.Array) -> pa.Array:
    return column.dictionary_decode() if pa.types.is_dictionary(column.type) else column


def _utf8_bytes(column: pa.Array) -> int:
    """Bytes of the values of `column` written as UTF-8 strings."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = pc.cast(column, pa.string())
    return int(pc.sum(pc.binary_length(column)).as_py() or 0)
