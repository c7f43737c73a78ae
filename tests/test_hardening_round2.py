"""Second hostile-user battery: each bad input is refused in one line, before anything
is written (competition names and holdouts, sweeps resumed with other settings, block
sizes beyond an int64, null series ids, a rank killed under torchrun)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _task_stores import build_encoded_store
from competition_data import write_competition
from optuna.distributions import FloatDistribution

from metadist.cli import main as cli_main
from metadist.commands.competition import check_holdout, load_spec, scan_series
from metadist.commands.competition import main as competition_main
from metadist.commands.competition.spec import CompetitionSpec, default_output
from metadist.data import BatchMetaDataLoader
from metadist.launch.sweep import (
    STUDY_FILE,
    STUDY_NAME,
    SweepSettings,
    load_search_space,
    open_study,
)
from metadist.launch.sweep.study import check_meta

FORECAST = {"lookback": 16, "horizon": 4, "num_support": 3, "num_query": 2}


@pytest.mark.parametrize("name", ["block_bytes", "window_blocks"])
def test_a_block_setting_beyond_int64_is_refused_naming_it(tmp_path, name):
    store = build_encoded_store(tmp_path, [40, 50, 60, 70])
    settings = {"block_bytes": 8192, "window_blocks": 3, name: 2**70}
    with pytest.raises(ValueError, match=rf"^{name} must be at most 2\*\*63-1"):
        BatchMetaDataLoader(
            "forecast",
            np.arange(4),
            batch_size=1,
            store=store,
            order="blocked",
            sampler_options=FORECAST,
            **settings,
        )
    # the largest int64 is still a block size (one block holds everything)
    loader = BatchMetaDataLoader(
        "forecast",
        np.arange(4),
        batch_size=1,
        store=store,
        order="blocked",
        sampler_options=FORECAST,
        block_bytes=2**63 - 1,
    )
    assert len(list(loader)) > 0


# ---- metadist competition: the output name, the holdout, null series ids -----------------


@pytest.fixture(scope="module")
def competition_dir(tmp_path_factory):
    return write_competition(tmp_path_factory.mktemp("competition") / "data")


def _copy(data: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(data, tmp_path / "data"))


def _one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


# two names in `make test`, the rest under `make test-slow` (each is two CLI processes)
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "name",
    [
        "..",
        pytest.param("../escape", marks=_SLOW),
        "ABSOLUTE",
        pytest.param("a/b", marks=_SLOW),
        pytest.param("a\\\\b", marks=_SLOW),
        pytest.param(".", marks=_SLOW),
        pytest.param("-x", marks=_SLOW),
    ],
)
def test_a_competition_name_that_is_not_a_plain_word_is_refused(
    competition_dir, tmp_path, capsys, name
):
    data = _copy(competition_dir, tmp_path)
    name = name.replace("ABSOLUTE", str(tmp_path / "abs-out"))
    (data / "competition.yaml").write_text(f"name: {json.dumps(name)}\n")
    work = tmp_path / "work"
    work.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    for validation in ([], ["--validation"]):
        done = subprocess.run(
            [sys.executable, "-m", "metadist.cli", "competition", str(data), *validation],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"name {name!r}" in lines[0], lines
        assert "plain word" in lines[0] and "--out" in lines[0]
    assert list(work.iterdir()) == []  # no runs/ under the working directory
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing beside it


def test_the_default_output_is_one_directory_under_runs(competition_dir, tmp_path):
    data = _copy(competition_dir, tmp_path)
    assert default_output(CompetitionSpec(name="m3-small.v2"), data) == Path("runs/m3-small.v2")
    assert default_output(CompetitionSpec(name="M3"), data, "_val") == Path("runs/M3_val")
    spaced = Path(shutil.copytree(data, tmp_path / "my data"))
    assert default_output(CompetitionSpec(), spaced) == Path("runs/my data")
    with pytest.raises(ValueError, match="does not name a directory under runs/"):
        default_output(CompetitionSpec(), Path("/"))


def _write(frame, path: Path) -> None:
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


@pytest.mark.parametrize(
    "case, message",
    [
        ("no value column", r"has no column 'value' \(value_col in competition.yaml\)"),
        ("no time column", r"has no column 't' \(time_col in competition.yaml\)"),
        ("NaN value", r"test.parquet: row 3: column 'value' is nan \(1 such rows\)"),
        ("null value", r"test.parquet: row 3: column 'value' is null$"),
        ("null time", r"test.parquet: row 3: column 't' is null$"),
        ("text values", r"column 'value' \(value_col in competition.yaml\) must hold numbers"),
        (
            "overlap",
            r"series 'S001' has holdout values from t (\d+), not after its training part \(last t \1\)",
        ),
        ("no rows", r"test.parquet has no rows"),
    ],
)
def test_holdout_problems_the_evaluation_would_find_are_found_before_training(
    competition_dir, tmp_path, capsys, case, message
):
    data = _copy(competition_dir, tmp_path)
    test = pq.read_table(data / "test.parquet").to_pandas()
    if case == "no value column":
        test = test.drop(columns=["value"])
    elif case == "no time column":
        test = test.drop(columns=["t"])
    elif case in ("NaN value", "null value", "null time"):
        column = "t" if case == "null time" else "value"
        values = test[column].tolist()
        values[3] = float("nan") if case == "NaN value" else None
        table = pa.Table.from_pandas(test, preserve_index=False)
        index = table.schema.get_field_index(column)
        field = table.schema.field(column)
        test = table.set_column(index, field, pa.array(values, field.type))
    elif case == "text values":
        test["value"] = test["value"].astype(str) + "x"
    elif case == "overlap":
        test.loc[test.series_id == "S001", "t"] -= 1
    elif case == "no rows":
        test = test.iloc[:0]
    if isinstance(test, pa.Table):
        pq.write_table(test, data / "test.parquet")
    else:
        _write(test, data / "test.parquet")
    spec = load_spec(data)
    info = scan_series(data / "train.parquet", spec)
    horizons = sorted(set(info.horizons.values()))
    with pytest.raises(ValueError, match=message):
        check_holdout(data / "test.parquet", spec, info, horizons, partial=True)
    out = tmp_path / "out"
    assert competition_main([str(data), "--out", str(out), "--ets", "no"]) == 1
    assert re.search(message, _one_line(capsys))
    assert not out.exists()


@pytest.mark.parametrize("part", ["train", "test"])
def test_a_null_series_id_is_refused_naming_the_file_and_column(
    competition_dir, tmp_path, capsys, part
):
    data = _copy(competition_dir, tmp_path)
    table = pq.read_table(data / f"{part}.parquet")
    ids = table.column("series_id").to_pylist()
    ids[5] = None
    index = table.schema.get_field_index("series_id")
    table = table.set_column(index, table.schema.field(index), pa.array(ids, pa.string()))
    pq.write_table(table, data / f"{part}.parquet")
    wording = rf"{part}.parquet: row 5: column 'series_id' is null$"
    for validation in ([], ["--validation"]):
        if part == "test" and validation:
            continue  # the validation protocol never reads the test file
        out = tmp_path / "out"
        assert competition_main([str(data), "--out", str(out), *validation]) == 1
        assert re.search(wording, _one_line(capsys))
        assert not out.exists()
    # the same wording as the store ingest's
    if part == "train":
        assert (
            cli_main(
                [
                    "ingest",
                    str(data / "train.parquet"),
                    str(tmp_path / "store"),
                    "--entity-col=series_id",
                    "--time-col=t",
                    "--features=value",
                ]
            )
            == 1
        )
        assert re.search(wording, capsys.readouterr().err)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_training_value_that_is_not_finite_is_refused_before_any_output(
    competition_dir, tmp_path, capsys, bad
):
    """The scan refuses it in one line naming the row and the fix, before `--out` is
    made (the ingest refused it after, pointing at --nan options the command lacks)."""
    data = _copy(competition_dir, tmp_path)
    table = pq.read_table(data / "train.parquet")
    values = table.column("value").to_pylist()
    values[7] = bad
    index = table.schema.get_field_index("value")
    pq.write_table(table.set_column(index, "value", pa.array(values)), data / "train.parquet")
    out = tmp_path / "out"
    assert competition_main([str(data), "--out", str(out)]) == 1
    line = _one_line(capsys)
    assert f"train.parquet: row 7: column 'value' is {bad}" in line and "drop or fill" in line
    assert "--nan" not in line and not out.exists()


def test_a_validation_horizon_without_series_long_enough_is_refused_before_any_output(
    competition_dir, tmp_path, capsys
):
    data = _copy(competition_dir, tmp_path)
    train = pq.read_table(data / "train.parquet").to_pandas()
    # every ANNUAL series (horizon 4) cut to 4 values: none can hold out its last 4
    annual = train[train.frequency == "ANNUAL"].groupby("series_id").head(4)
    _write(pd.concat([train[train.frequency != "ANNUAL"], annual]), data / "train.parquet")
    out = tmp_path / "val"
    assert competition_main([str(data), "--validation", "--out", str(out)]) == 1
    line = _one_line(capsys)
    assert "no series of horizon 4 (ANNUAL) has more than 4 training values" in line
    assert "--horizons" in line
    assert not out.exists()


def test_settings_the_evaluation_would_refuse_are_refused_before_any_output(
    competition_dir, tmp_path, capsys
):
    data = _copy(competition_dir, tmp_path)
    # references given as a bare figure (they map all/label to figures)
    (data / "competition.yaml").write_text("references: {Theta: 13.0}\n")
    for validation in ([], ["--validation"]):
        out = tmp_path / "out"
        assert competition_main([str(data), "--out", str(out), *validation]) == 1
        assert "references.Theta must map all/label to figures" in _one_line(capsys)
        assert not out.exists()
    # an evaluation override is checked before the validation split is written
    (data / "competition.yaml").unlink()
    out = tmp_path / "val"
    assert competition_main([str(data), "--validation", "--out", str(out), "eval.bogus=1"]) == 1
    assert "eval.bogus: unknown field" in _one_line(capsys)
    assert not out.exists()


# ---- sweeps: a study.db made for another sweep is never adopted -------------------------

SWEEP = ["experiment=sinusoid_maml", "trainer.meta_steps=4"]
LR_SPACE = "optimizer.lr: {type: float, low: 1e-4, high: 1e-2, log: true}\n"


def _sweep_settings(tmp_path: Path, overrides=SWEEP, space=LR_SPACE, **extra) -> SweepSettings:
    (tmp_path / "space.yaml").write_text(space)
    space_specs = load_search_space(tmp_path / "space.yaml")
    return SweepSettings(list(overrides), space_specs, tmp_path / "sweep", **extra)


def _started_sweep(tmp_path: Path) -> Path:
    """A real study.db as a sweep leaves it: its settings recorded, one finished trial."""
    settings = _sweep_settings(tmp_path)
    settings.sweep_dir.mkdir()
    study = open_study(settings)
    check_meta(study, settings)
    trial = study.ask()
    settings.space[0].suggest(trial)
    study.tell(trial, 0.5)
    return settings.sweep_dir / STUDY_FILE


def _sweep_command(tmp_path: Path, overrides=SWEEP, space=LR_SPACE, *flags: str) -> list[str]:
    (tmp_path / "space.yaml").write_text(space)
    return [
        "sweep",
        *overrides,
        "--trials=2",
        f"--space={tmp_path / 'space.yaml'}",
        f"--sweep-dir={tmp_path / 'sweep'}",
        *flags,
    ]


def _study_state(path: Path) -> tuple:
    storage = f"sqlite:///{path}"
    studies = optuna.get_all_study_summaries(storage)
    return tuple(
        (s.study_name, s.n_trials, json.dumps(s.user_attrs, sort_keys=True)) for s in studies
    )


@pytest.mark.parametrize(
    "overrides, space, flags, differs",
    [
        (
            ["experiment=synthetic_maml", "trainer.meta_steps=4"],
            LR_SPACE,
            [],
            "overrides: recorded only ['experiment=sinusoid_maml'], now only "
            "['experiment=synthetic_maml']",
        ),
        (SWEEP, LR_SPACE.replace("1e-2", "1e-1"), [], "space: optimizer.lr differs"),
        (
            SWEEP,
            LR_SPACE + "learner.options.inner_lr: {type: float, low: 0.01, high: 0.5}\n",
            [],
            "space: learner.options.inner_lr only now",
        ),
        (SWEEP, LR_SPACE, ["--metric=mse"], "metric: recorded 'loss', now 'mse'"),
        (  # (a loss maximised is refused before the study is read: an accuracy here)
            SWEEP,
            LR_SPACE,
            ["--metric=query_accuracy_after", "--direction=maximize"],
            "metric: recorded 'loss', now 'query_accuracy_after'; direction: recorded 'minimize'",
        ),
    ],
    ids=["experiment", "space-range", "space-param", "metric", "direction"],
)
def test_a_sweep_is_continued_only_with_the_settings_its_study_was_made_for(
    tmp_path, capsys, overrides, space, flags, differs
):
    path = _started_sweep(tmp_path)
    before = _study_state(path)
    assert cli_main(_sweep_command(tmp_path, overrides, space, *flags)) == 1
    line = _one_line(capsys)
    assert f"{path} holds a sweep made for other settings ({differs}" in line, line
    assert "use another --sweep-dir" in line
    assert _study_state(path) == before  # nothing recorded, no trial added
    assert not (tmp_path / "sweep" / "trials").exists()
    # the same settings still continue it
    settings = _sweep_settings(tmp_path)
    check_meta(open_study(settings), settings)


def test_a_study_with_trials_but_no_sweep_record_is_not_adopted(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    path = tmp_path / "sweep" / STUDY_FILE
    study = optuna.create_study(storage=f"sqlite:///{path}", study_name=STUDY_NAME)
    study.tell(study.ask({"optimizer.lr": FloatDistribution(1e-4, 1e-2)}), 0.1)
    before = _study_state(path)
    assert cli_main(_sweep_command(tmp_path)) == 1
    assert "holds a study with trials but no record of its sweep's settings" in _one_line(capsys)
    assert _study_state(path) == before


def test_a_database_of_another_optuna_study_is_left_untouched(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    path = tmp_path / "sweep" / STUDY_FILE
    optuna.create_study(storage=f"sqlite:///{path}", study_name="someone-elses")
    before = _study_state(path)
    assert cli_main(_sweep_command(tmp_path)) == 1
    line = _one_line(capsys)
    assert f"{path} holds another Optuna study ('someone-elses'), not a metadist sweep" in line
    assert _study_state(path) == before  # no metadist study added to it


def test_an_sqlite_database_of_something_else_is_left_untouched(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    path = tmp_path / "sweep" / STUDY_FILE
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
        db.commit()
    content = path.read_bytes()
    assert cli_main(_sweep_command(tmp_path)) == 1
    assert "is an SQLite database of something else (tables notes)" in _one_line(capsys)
    assert path.read_bytes() == content
