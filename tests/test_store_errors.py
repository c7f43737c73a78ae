"""Bad input to `ingest`: each case stops with a message naming the culprit, and leaves
nothing at OUT (nor a temporary directory beside it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_panel import make_panel, write_files

from metadist.cli import main as cli_main
from metadist.store import ingest


def _ingest(src, out, **options):
    defaults = dict(entity_col="entity", time_col="t", features=["a", "b"], targets=["y"])
    defaults.update(options)
    return ingest(src, out, progress=False, batch_size=64, **defaults)


def _assert_fails(tmp_path: Path, src, *patterns: str, error=ValueError, **options) -> None:
    out = tmp_path / "out"
    with pytest.raises(error) as caught:
        _ingest(src, out, **options)
    message = str(caught.value)
    for pattern in patterns:
        assert pattern in message, f"{pattern!r} not in {message!r}"
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.fixture()
def panel() -> pa.Table:
    return make_panel(seed=5, num_entities=12)


def test_missing_column(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    _assert_fails(tmp_path, src, "'price'", "--features", "part-0.parquet", features=["a", "price"])


def test_missing_stratum_column(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    _assert_fails(tmp_path, src, "'sensor'", "--stratum-col", stratum_col="sensor")


def test_non_numeric_feature(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    _assert_fails(tmp_path, src, "'kind'", "string", "numeric", features=["a", "kind"])


@pytest.mark.parametrize("bad", [np.nan, np.inf, None])
def test_nan_inf_null_under_nan_error(tmp_path, panel, bad):
    rows = panel.to_pylist()
    rows[37]["a"] = bad
    table = pa.Table.from_pylist(rows, schema=panel.schema)
    pq.write_table(table, tmp_path / "one.parquet")
    entity = rows[37]["entity"]
    shown = {None: "is null", np.inf: "is inf"}.get(bad, "is nan")
    _assert_fails(tmp_path, tmp_path / "one.parquet", "row 37", "'a'", repr(entity), shown, "--nan")


def test_duplicate_entity_time(tmp_path, panel):
    src = write_files(panel, tmp_path / "src", num_files=2)
    duplicate = panel.slice(10, 1)
    pq.write_table(duplicate, src / "part-9.parquet")
    entity = duplicate["entity"][0].as_py()
    when = duplicate["t"][0].as_py()
    _assert_fails(tmp_path, src, "duplicate", repr(entity), f"t = {when}", "part-9.parquet row 0")


@pytest.mark.parametrize(("column", "option"), [("kind", "stratum_col"), ("cls", "label_col")])
def test_stratum_or_label_not_constant(tmp_path, panel, column, option):
    values = panel[column].to_pylist()
    entity = panel["entity"][20].as_py()
    values[20] = "other" if column == "kind" else 7
    table = panel.set_column(panel.schema.get_field_index(column), column, pa.array(values))
    pq.write_table(table, tmp_path / "one.parquet")
    _assert_fails(
        tmp_path,
        tmp_path / "one.parquet",
        "not constant",
        repr(entity),
        f"'{column}'",
        "row",
        **{option: column},
    )


def test_every_entity_too_short(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    _assert_fails(tmp_path, src, "12 entities are shorter than --min-length 1000", min_length=1000)


def test_empty_input(tmp_path, panel):
    pq.write_table(panel.slice(0, 0), tmp_path / "empty.parquet")
    _assert_fails(tmp_path, tmp_path / "empty.parquet", "empty input")
    (tmp_path / "nothing").mkdir()
    _assert_fails(tmp_path, tmp_path / "nothing", "empty input", "nothing")


def test_missing_source(tmp_path):
    _assert_fails(tmp_path, tmp_path / "absent.parquet", "absent.parquet", error=FileNotFoundError)
    _assert_fails(tmp_path, str(tmp_path / "*.parquet"), "*.parquet", error=FileNotFoundError)


def test_not_parquet(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    (src / "notes.parquet").write_text("entity,t,a\nx,1,2\n")  # a CSV, misnamed
    _assert_fails(tmp_path, src, "notes.parquet", "not a readable Parquet file")


def test_truncated_parquet(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    data = (src / "part-1.parquet").read_bytes()
    (src / "part-1.parquet").write_bytes(data[: len(data) // 2])
    _assert_fails(tmp_path, src, "part-1.parquet")


def test_corrupt_pages(tmp_path, panel):
    path = tmp_path / "one.parquet"
    pq.write_table(panel, path, compression="snappy", row_group_size=50)
    data = bytearray(path.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 400] = bytes(400)
    path.write_bytes(bytes(data))
    _assert_fails(tmp_path, path, "one.parquet")


def test_schema_differs_between_files(tmp_path, panel):
    """A column the ingest reads, of another type or missing in one file (files
    without rows, columns it does not read, features of another numeric type and times
    of another width are not refused: `test_store_source_schemas.py`)."""
    src = write_files(panel, tmp_path / "src", num_files=2)
    other = panel.slice(0, 3)
    stamps = other["t"].cast(pa.timestamp("ns"))  # times of another kind than integers
    other = other.set_column(other.schema.get_field_index("t"), "t", stamps)
    pq.write_table(other, src / "part-5.parquet")
    _assert_fails(tmp_path, src, "part-5.parquet", "'t'", "timestamp[ns]", "int64")
    (src / "part-5.parquet").unlink()
    pq.write_table(panel.slice(0, 3).drop_columns(["b"]), src / "part-6.parquet")
    _assert_fails(tmp_path, src, "part-6.parquet", "'b' (--features) is missing")


def test_bad_options(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    _assert_fails(tmp_path, src, "--scaling", scaling="minmax")
    _assert_fails(tmp_path, src, "--nan", nan="zero")
    _assert_fails(tmp_path, src, "--min-length", min_length=0)
    _assert_fails(tmp_path, src, "twice", features=["a", "a"])


def test_refuses_to_replace_a_non_store(tmp_path, panel):
    src = write_files(panel, tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a series store"):
        _ingest(src, out)
    assert (out / "precious.txt").read_text() == "keep me"


@pytest.mark.integration
def test_cli_reports_error_and_exit_code(tmp_path, panel, capsys):
    src = write_files(panel, tmp_path / "src")
    out = tmp_path / "out"
    code = cli_main(
        ["ingest", str(src), str(out), "--entity-col", "entity", "--time-col", "t",
         "--features", "a,missing", "--no-progress"]
    )  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("metadist ingest: error:") and "'missing'" in err
    assert not out.exists()
