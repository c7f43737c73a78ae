"""What an ingest was asked to do, fixed before the first pass (`IngestSettings`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from metadist.store import sources

NO_TIME = np.iinfo(np.int64).min
MAX_TIME = np.iinfo(np.int64).max


@dataclass(frozen=True)
class IngestSettings:
    """The input, the options and the parallelism of one ingest.

    `workers` threads decode row groups and do the passes' numpy work; the results they
    hand to the main thread (per-batch statistics, finished chunks) wait there up to
    `memory_limit` bytes in all, so memory is bounded by that, the workers' current
    record batches and the per-entity statistics, whatever the input."""

    files: tuple[sources.SourceFile, ...]
    units: tuple[sources.Unit, ...]
    columns: sources.Columns
    value_names: tuple[str, ...]
    time_kind: str
    dictionary_columns: tuple[str, ...]
    float32_values: bool  # every value column is float32: raw rows can be copied exactly
    scaling: str
    nan: str
    min_length: int
    batch_size: int
    workers: int
    memory_limit: int = 256 << 20

    @classmethod
    def of(
        cls,
        files: list[sources.SourceFile],
        schema: pa.Schema,
        columns: sources.Columns,
        **options,
    ) -> IngestSettings:
        value_names = tuple(columns.value_columns)
        dictionary_columns = tuple(
            name
            for name in (columns.entity, columns.stratum, columns.label)
            if name is not None
            and (pa.types.is_string(schema.field(name).type)
                 or pa.types.is_large_string(schema.field(name).type))
        )  # fmt: skip
        float32_values = all(pa.types.is_float32(schema.field(name).type) for name in value_names)
        return cls(
            files=tuple(files),
            units=tuple(sources.units(files)),
            columns=columns,
            value_names=value_names,
            time_kind=sources.time_kind(schema.field(columns.time).type),
            dictionary_columns=dictionary_columns,
            float32_values=float32_values,
            **options,
        )

    @property
    def num_rows_read(self) -> int:
        return sum(f.num_rows for f in self.files)

    @property
    def scan_columns(self) -> list[str]:
        columns = self.columns
        read = list(dict.fromkeys([columns.entity, columns.time, *self.value_names]))
        read += [c for c in (columns.stratum, columns.label) if c is not None and c not in read]
        return read

    @property
    def write_columns(self) -> list[str]:
        return list(dict.fromkeys([self.columns.entity, self.columns.time, *self.value_names]))
