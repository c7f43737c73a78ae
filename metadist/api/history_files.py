"""A history given as a path is read as `metadist ingest` reads its input.

A Parquet file, a directory of Parquet files (searched recursively; a README, `_SUCCESS`,
names starting with `.` or `_` and series stores are skipped) or a glob pattern
(`store.input_files.resolve_paths`), every file with the first one's columns
(`store.sources`). `pq.read_table` of a directory took every file in it for Parquet (a
README stopped it in Arrow's words) and took no glob, so a history that ingest reads was
refused.
"""

from __future__ import annotations

import os

import pyarrow as pa

from metadist.store.input_files import resolve_paths
from metadist.store.sources import check_same_schema, open_parquet


def read_history_files(src: str | os.PathLike) -> pa.Table:
    """The rows of every Parquet file `src` names, in file order.

    Raises:
        FileNotFoundError: nothing there, or nothing the pattern matches.
        ValueError: a file that is not Parquet, files of different columns or types, or a
            directory holding no Parquet file (each named).
    """
    try:
        paths = resolve_paths(os.fspath(src))
    except (FileNotFoundError, ValueError) as error:
        raise type(error)(f"history: {error}") from None
    schema = open_parquet(paths[0]).schema_arrow
    tables = []
    for path in paths:
        parquet = open_parquet(path)
        check_same_schema(paths[0], schema, path, parquet.schema_arrow)
        tables.append(parquet.read())
    return pa.concat_tables(tables)
