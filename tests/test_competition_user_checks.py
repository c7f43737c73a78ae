"""`metadist competition` refuses, in one line and before anything is written, inputs a
new user can get wrong: another data set's validation output given to
`--adaptation-from`, a holdout that does not continue its series' steps, a
competition.yaml horizon that is not a whole number, a holdout file that is not
Parquet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from competition_data import write_competition

from metadist.commands.competition import main as competition
from metadist.commands.competition.output import claim_output


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_competition(tmp_path_factory.mktemp("competition") / "data")


def _copy(data_dir: Path, to: Path) -> Path:
    shutil.copytree(data_dir, to)
    return to


def _refused(args: list[str], out: Path, capsys) -> str:
    """Runs the command, which must refuse in one line, writing nothing at `out`."""
    # a short training, where the old code would not refuse
    assert competition([*args, "--out", str(out), "--ets", "no", "trainer.meta_steps=2"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert not out.exists()
    return lines[0]


@pytest.mark.timeout(120)
def test_adaptation_from_another_data_sets_validation_run_is_refused(data_dir, tmp_path, capsys):
    other = _copy(data_dir, tmp_path / "other")
    val_out = tmp_path / "other_val"
    claim_output(val_out, other / "train.parquet", validation=True)
    choices = {h: {"metric": "smape", "choice": "adapted"} for h in ("4", "13", "24")}
    (val_out / "adaptation.json").write_text(
        json.dumps({"protocol": "validation", "horizons": choices})
    )
    line = _refused([str(data_dir), "--adaptation-from", str(val_out)], tmp_path / "out", capsys)
    assert "--adaptation-from" in line and str(other.resolve() / "train.parquet") in line


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shift", ["gap", "repeated"])
def test_a_holdout_that_does_not_continue_its_series_is_refused(data_dir, tmp_path, capsys, shift):
    data = _copy(data_dir, tmp_path / "data")
    table = pq.read_table(data / "test.parquet")
    series = table.column("series_id")[0].as_py()
    own = pc.equal(table.column("series_id"), series).to_numpy(zero_copy_only=False)
    times = table.column("t").to_numpy().copy()
    if shift == "gap":
        times[own] += 5  # starts 5 steps late
    else:
        rows = own.nonzero()[0]
        times[rows[-1]] = times[rows[-2]]  # its last step given twice
    table = table.set_column(table.schema.get_field_index("t"), "t", pa.array(times))
    pq.write_table(table, data / "test.parquet")
    line = _refused([str(data)], tmp_path / "out", capsys)
    assert repr(series) in line and "continues its series' steps" in line


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["six", "13.5", "true"])
def test_a_horizon_that_is_not_a_whole_number_is_named(data_dir, tmp_path, capsys, value):
    data = _copy(data_dir, tmp_path / "data")
    table = pq.read_table(data / "train.parquet").drop(["horizon"])
    pq.write_table(table, data / "train.parquet")
    (data / "competition.yaml").write_text(
        f"horizon_col: null\nhorizons: {{ANNUAL: 4, WEEKLY: {value}, MONTHLY: 24}}\n"
    )
    line = _refused([str(data)], tmp_path / "out", capsys)
    assert "competition.yaml.horizons.WEEKLY must be an integer" in line


@pytest.mark.timeout(120)
@pytest.mark.parametrize("part", ["train", "test"])
def test_a_data_file_that_is_not_parquet_is_named(data_dir, tmp_path, capsys, part):
    data = _copy(data_dir, tmp_path / "data")
    (data / f"{part}.parquet").write_text("not parquet\n")
    line = _refused([str(data)], tmp_path / "out", capsys)
    assert f"{data / part}.parquet is not a readable Parquet file" in line


@pytest.mark.timeout(120)
def test_a_holdout_series_under_another_label_is_refused(data_dir, tmp_path, capsys):
    data = _copy(data_dir, tmp_path / "data")
    table = pq.read_table(data / "test.parquet")
    series = table.column("series_id")[0].as_py()
    own = pc.equal(table.column("series_id"), series).to_numpy(zero_copy_only=False)
    label = table.column("frequency")[0].as_py()
    other = next(v for v in table.column("frequency").to_pylist() if v != label)
    before = table.column("frequency").to_pylist()
    labels = [other if mine else v for mine, v in zip(own, before, strict=True)]
    index = table.schema.get_field_index("frequency")
    table = table.set_column(index, "frequency", pa.array(labels, table.schema.field(index).type))
    pq.write_table(table, data / "test.parquet")
    line = _refused([str(data)], tmp_path / "out", capsys)
    assert f"series {series!r} has frequency {other!r} there but {label!r}" in line
