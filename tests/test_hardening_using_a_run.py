"""Using a trained run on new data, from a review: each defect ends in a forecast that says
what it is (a diverged one is NaN and named), or in one line naming what is wrong.

Real parts: a synthetic panel ingested into two stores (global scaling with --nan error,
per-entity scaling with --nan drop), runs of two meta-steps trained on them, `load_run`
and `metadist forecast` as a user calls them.
"""

import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import metadist
from metadist.cli import main
from metadist.datasets.synthetic import (
    SYNTHETIC_ENTITY,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_TIME,
    write_synthetic_panel,
)
from metadist.store.ingest import ingest

pytestmark = pytest.mark.integration
H = 8  # the synthetic_maml sampler's horizon
SHORT = ["trainer.meta_steps=2", "trainer.meta_batch_size=2", "trainer.checkpoint_every=2",
         "trainer.eval_every=0", "logging.wandb.mode=disabled", "logging.progress=false",
         "--no-eval"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("using")
    panel = tmp / "panel"
    write_synthetic_panel(panel, num_entities=40, length_range=(120, 160), seed=3, nan_fraction=0)
    out = {"panel": panel}
    for scaling, nan in (("global", "error"), ("per-entity", "drop")):
        store = tmp / f"store-{nan}"
        ingest(
            panel,
            store,
            progress=False,
            **{**SYNTHETIC_INGEST_ARGS, "scaling": scaling, "nan": nan},
        )
        out[nan] = tmp / f"run-{nan}"
        assert main(["train", "experiment=synthetic_maml", f"data.store={store}",
                     f"run_dir={out[nan]}", *SHORT]) == 0  # fmt: skip
    out["classifier"] = tmp / "protonet"
    assert main(["train", "experiment=synthetic_protonet", f"data.store={tmp / 'store-error'}",
                 f"run_dir={out['classifier']}", "data.split_by=unit",
                 "sampler.options.class_by=stratum", "sampler.options.num_ways=2",
                 "sampler.options.num_query=1", "sampler.options.lookback=null",
                 *SHORT]) == 0  # fmt: skip
    out["sinusoid"] = tmp / "sinusoid"
    assert main(["train", "experiment=sinusoid_maml", "sampler.options.num_tasks=40",
                 f"run_dir={out['sinusoid']}", *SHORT]) == 0  # fmt: skip
    return out


def _history(runs, index: int = 2) -> pa.Table:
    panel = pq.read_table(runs["panel"])
    key = sorted(set(panel.column(SYNTHETIC_ENTITY).to_pylist()))[index]
    return panel.filter(pc.equal(panel[SYNTHETIC_ENTITY], key)).sort_by(SYNTHETIC_TIME)


def _with(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, pa.array(values))


def _cli(runs, history: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "metadist.cli", "forecast", str(runs["error"]), str(history)]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


def test_a_forecast_that_is_not_finite_is_nan_and_named_as_diverged(runs, capsys, tmp_path):
    """An entity far outside the training range of a globally scaled store: adaptation
    diverges; its rows stay NaN, and one line names it (the command said only "written")."""
    history = _history(runs)
    far = _with(history, "y", history.column("y").to_numpy() * 1e6 + 1e12)
    run = metadist.load_run(runs["error"])
    capsys.readouterr()
    table = run.forecast(far, methods=["adapted", "naive"])
    adapted = pc.equal(table["method"], "adapted")
    assert np.isnan(table.filter(adapted).column("y").to_numpy()).all()
    assert np.isfinite(table.filter(pc.invert(adapted)).column("y").to_numpy()).all()
    key = history.column(SYNTHETIC_ENTITY)[0].as_py()
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "warning: forecast diverged (not finite, or beyond 10^6 times the history's largest "
        f"value; its rows are NaN): adapted of 1 entity ('{key}')"
    ]
    pq.write_table(far, tmp_path / "far.parquet")
    done = _cli(runs, tmp_path / "far.parquet", "--out", str(tmp_path / "f.parquet"))
    assert done.returncode == 0, done.stderr
    assert "adapted of 1 entity" in done.stderr and "diverged" in done.stderr
    # evaluation's rule: a finite forecast beyond 10^6 times the history's largest value
    from metadist.api.forecasting import diverged_as_nan

    entity = SimpleNamespace(key="e", values=np.ones((10, 1)))
    forecasts = {"adapted": np.array([[[2.0e6], [1.0]]]), "unadapted": np.ones((1, 2, 1))}
    diverged_as_nan([entity], forecasts, [0])
    assert np.isnan(forecasts["adapted"]).all() and not np.isnan(forecasts["unadapted"]).any()


def test_the_drop_rule_refuses_a_history_that_ends_in_dropped_rows_or_keeps_one_row(runs, capsys):
    run = metadist.load_run(runs["drop"])  # per-entity scaling, --nan drop
    history = _history(runs)
    key, times = history.column(SYNTHETIC_ENTITY)[0].as_py(), history.column(SYNTHETIC_TIME)
    values = history.column("y").to_numpy().copy()
    values[-2:] = np.nan  # the forecasts were given times inside the history
    with pytest.raises(
        ValueError,
        match=rf"^history: entity '{key}' ends in rows the store's --nan drop rule removes "
        rf"\(after time={times[-3]}, up to {times[-1]}\).*give the history up to its last value$",
    ):
        run.forecast(_with(history, "y", values))
    one = np.full(history.num_rows, np.nan)
    one[3] = 1.0  # was forecast from one row
    with pytest.raises(ValueError, match=rf"entity '{key}' has one row \(time={times[3]}\) once"):
        run.forecast(_with(history, "y", one))
    with pytest.raises(ValueError, match=f"entity '{key}' has no row left once"):
        run.forecast(_with(history, "y", np.full(history.num_rows, np.nan)))
    values = history.column("y").to_numpy().copy()
    values[10] = np.nan  # inside the history: dropped, as ingest dropped it for training
    capsys.readouterr()
    table = run.forecast(_with(history, "y", values))
    assert table.column(SYNTHETIC_TIME).to_pylist() == [
        times[-1].as_py() + s for s in range(1, H + 1)
    ]
    assert "1 non-finite rows dropped" in capsys.readouterr().err


@pytest.mark.parametrize("ids", [pa.int64(), pa.int32(), pa.float64()])
def test_the_entity_column_keeps_its_type(runs, ids):
    history = pa.concat_tables([_history(runs, 2), _history(runs, 3)])
    codes = pc.cast(pc.equal(history[SYNTHETIC_ENTITY], history[SYNTHETIC_ENTITY][0]), pa.int64())
    numbered = _with(history, SYNTHETIC_ENTITY, pc.cast(pc.add(codes, 10), ids))
    table = metadist.load_run(runs["error"]).forecast(numbered)
    assert table.schema.field(SYNTHETIC_ENTITY).type == ids
    assert sorted(set(table.column(SYNTHETIC_ENTITY).to_pylist())) == [10, 11]
    joined = table.join(numbered.select([SYNTHETIC_ENTITY]).group_by(SYNTHETIC_ENTITY).aggregate([]),
                        SYNTHETIC_ENTITY)  # fmt: skip
    assert joined.num_rows == table.num_rows == 2 * H


def test_times_in_messages_are_the_histories_local_times(runs):
    """A tz-aware history: every message shows the zone's wall-clock time with its offset
    (the duplicate-row message showed UTC without a zone)."""
    run = metadist.load_run(runs["error"])
    history = _history(runs)
    hourly = pa.array(
        np.datetime64("2024-03-01T00:00:00") + np.arange(history.num_rows) * np.timedelta64(1, "h")
    ).cast(pa.timestamp("s", "America/New_York"))
    local = _with(history, SYNTHETIC_TIME, hourly)
    doubled = pa.concat_tables([local.slice(0, 60), local.slice(59, 1)])
    # row 59 is 2024-03-03 11:00 UTC, 06:00 in New York
    with pytest.raises(ValueError, match=r"two rows at time=2024-03-03 06:00:00-05:00$"):
        run.forecast(doubled)
    values = local.column("y").to_numpy().copy()
    values[59] = np.nan
    with pytest.raises(
        ValueError, match=r"has nan in column 'y' at time 2024-03-03 06:00:00-05:00;"
    ):
        run.forecast(_with(local, "y", values))
    gapped = pa.concat_tables([local.slice(0, 59), local.slice(61)])
    with pytest.raises(ValueError, match=r"gap: time 2024-03-03 05:00:00-05:00 is followed by "
                       r"2024-03-03 08:00:00-05:00, where"):  # fmt: skip
        run.forecast(gapped)


def test_a_timestamp_beyond_nanoseconds_is_one_line(runs):
    history = _history(runs)
    days = np.datetime64("1500-01-01T00:00:00") + np.arange(history.num_rows) * np.timedelta64(
        86_400, "s"
    )
    old = _with(history, SYNTHETIC_TIME, pa.array(days).cast(pa.timestamp("s")))
    key = history.column(SYNTHETIC_ENTITY)[0].as_py()
    with pytest.raises(ValueError, match=rf"^history: row 0 \(entity '{key}'\): column 'time' "
                       r"holds 1500-01-01 00:00:00, beyond .*the years 1677 to 2262"):  # fmt: skip
        metadist.load_run(runs["error"]).forecast(old)


def test_irregular_steps_are_not_called_a_gap(runs):
    history = _history(runs)
    times = np.arange(history.num_rows) * 2
    times[50:] -= 1  # one step of 1 among steps of 2: no rows added make it regular
    key = history.column(SYNTHETIC_ENTITY)[0].as_py()
    with pytest.raises(ValueError, match=rf"^history: entity '{key}' has irregular steps: time 98 "
                       "is followed by 99, 1 later, where its rows are otherwise 2 apart"):  # fmt: skip
        metadist.load_run(runs["error"]).forecast(_with(history, SYNTHETIC_TIME, times))


def test_a_method_named_twice_is_refused(runs, tmp_path):
    run, history = metadist.load_run(runs["error"]), _history(runs)
    with pytest.raises(ValueError, match="^forecast method 'adapted' is named twice"):
        run.forecast(history, methods=["adapted", "naive", "adapted"])
    with pytest.raises(ValueError, match="'theta\\+theta' combines a method with itself"):
        run.forecast(history, methods=["theta+theta"])
    pq.write_table(history, tmp_path / "h.parquet")
    done = _cli(runs, tmp_path / "h.parquet", "--out", str(tmp_path / "f.parquet"),
                "--methods", "adapted,adapted")  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("'adapted' is named twice; name each method once")


def test_out_is_refused_where_it_would_replace_the_history(runs, tmp_path):
    history = _history(runs)
    path = tmp_path / "h.parquet"
    pq.write_table(history, path)
    folder = tmp_path / "panel"
    folder.mkdir()
    pq.write_table(history, folder / "part-0.parquet")
    (tmp_path / "link.parquet").symlink_to(path)
    for source, out, said in (
        (path, path, "is the history"),
        (path, tmp_path / "link.parquet", "is the history"),
        (folder, folder / "forecasts.parquet", "is inside the history directory"),
    ):
        done = _cli(runs, source, "--out", str(out))
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert said in done.stderr.strip().splitlines()[-1]
    assert pq.read_table(path).equals(history)
    assert sorted(p.name for p in folder.iterdir()) == ["part-0.parquet"]


def test_runs_of_another_kind_are_named_properly(runs):
    sinusoid = metadist.load_run(runs["sinusoid"])
    # said alike from Python and by metadist forecast (it named the method, forecast())
    with pytest.raises(
        ValueError,
        match="is a run of the sinusoid sampler without a series store: it cannot forecast; "
        "forecasting needs a run of a sampler of forecast windows on a series store$",
    ):
        sinusoid.forecast(_history(runs))
    with pytest.raises(ValueError, match="is a run of the sinusoid sampler .*, not a classifier$"):
        sinusoid.classify([], [], [])
    # a whole-series classifier as a forecaster's member: "looks back None rows" before
    with pytest.raises(ValueError, match=r"is a run of another kind \(sampler 'nway_kshot', "
                       "the evaluated run's 'forecast'\\)"):  # fmt: skip
        metadist.load_run(runs["error"], ensemble=[runs["classifier"]])


def test_classify_input_errors_name_the_argument_and_the_shapes_taken(runs):
    run = metadist.load_run(runs["classifier"])
    columns = run.source.store.column_names
    rng = np.random.default_rng(0)
    examples = [rng.normal(size=(60, len(columns))) for _ in range(4)]
    labels = ["a", "b", "a", "b"]
    assert run.classify(examples, labels, examples).tolist() == labels
    large = [e.copy() for e in examples]
    large[1][3, 0] = 1e200
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning leaked before the refusal
        with pytest.raises(ValueError, match=rf"^support_x\[1\] has 1e\+200 in column "
                           rf"'{columns[0]}' at row 3, beyond"):  # fmt: skip
            run.classify(large, labels, examples)
        large[1][3, 0] = 1e100  # within the store's range, beyond float32 once scaled
        with pytest.raises(ValueError, match=r"^query_x\[1\] has 1e\+100 .* beyond float32"):
            run.classify(examples, labels, large)
    with pytest.raises(ValueError, match=r"^support_labels\[0\] is a list \(\[1\]\); a label must "
                       "be hashable"):  # fmt: skip
        run.classify(examples, [[1], [2], [1], [2]], examples)
    taken = r"takes a list of \[T\] or \[T, C\] arrays, or one \[N, T, C\] array"
    with pytest.raises(
        ValueError, match=rf"^support_x is one array of shape \(4, 60\); support_x {taken}"
    ):
        run.classify(np.stack(examples)[..., 0], labels, examples)
    with pytest.raises(
        ValueError, match=rf"^query_x is one array of shape \(60,\); query_x {taken}"
    ):
        run.classify(examples, labels, examples[0][:, 0])
    with pytest.raises(ValueError, match=rf"^query_x is one series of 60 numbers; query_x {taken}"):
        run.classify(examples, labels, examples[0][:, 0].tolist())
