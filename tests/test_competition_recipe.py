"""`metadist competition`: the data set's metric, each group's seasonal period, the
periods a run records for `Run.forecast`, the CPU recipe and the training's progress."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import metadist
from metadist.api.artifact import PERIODS_FILE, recorded_periods, write_periods
from metadist.commands.competition import cli, load_spec, main, read_adaptation_choice, scan_series
from metadist.commands.competition.cli import RECIPE_LOOKBACKS, RECIPES
from metadist.commands.competition.eta import TrainingProgress, last_step
from metadist.commands.competition.members import (
    Group,
    groups_of,
    members_of,
    record_periods,
    series_periods,
    training_overrides,
)
from metadist.commands.competition.plan import model_takes_period, training_loss
from metadist.eval import baselines
from metadist.eval.settings import EvalOptions
from metadist.progress import Progress

ROOT = Path(__file__).resolve().parents[1]


def _write(out: Path, labels: dict[str, tuple[int, int, int]], metric: str | None = None) -> Path:
    """`out/train.parquet`, `out/test.parquet` of seasonal series: label -> (horizon,
    period, number of series), 60 training values each; `metric` in competition.yaml."""
    rng = np.random.default_rng(0)
    rows: dict[str, list] = {"train": [], "test": []}
    for label, (horizon, period, count) in labels.items():
        for i in range(count):
            t = np.arange(60 + horizon)
            values = 50 + 0.2 * t + 5 * np.sin(2 * np.pi * t / period) + rng.normal(0, 1, len(t))
            for step, value in zip(t, values, strict=True):
                part = "train" if step < 60 else "test"
                rows[part].append((f"{label}{i}", int(step), float(value), label, horizon, period))
    out.mkdir(parents=True, exist_ok=True)
    keys = ["series_id", "t", "value", "frequency", "horizon", "period"]
    for part, records in rows.items():
        table = pa.table({k: [r[j] for r in records] for j, k in enumerate(keys)})
        pq.write_table(table, out / f"{part}.parquet")
    spec = "stratum_col: null\n" + (f"metric: {metric}\n" if metric else "")
    (out / "competition.yaml").write_text(spec)
    return out


def test_the_data_sets_metric_is_read_and_checked(tmp_path):
    data = _write(tmp_path / "d", {"M": (6, 12, 2)}, metric="mape")
    assert load_spec(data).metric == "mape"
    (data / "competition.yaml").write_text("metric: owa\n")
    with pytest.raises(ValueError, match="metric must be one of smape, mape, mase"):
        load_spec(data)
    (data / "competition.yaml").write_text("name: x\n")
    assert load_spec(data).metric == "smape"


def test_the_training_loss_is_the_metric_where_a_loss_has_its_name(capsys):
    assert training_loss("mape") == "mape" and training_loss("smape") == "smape"
    assert training_loss("mase") == "smape"
    assert "no training loss is mase" in capsys.readouterr().out


def test_a_horizon_that_mixes_periods_splits_by_period_for_a_seasonal_model(tmp_path):
    data = _write(tmp_path / "d", {"Q": (8, 4, 2), "O": (8, 1, 2), "M": (18, 12, 2)})
    info = scan_series(data / "train.parquet", load_spec(data))
    assert groups_of(info, [8, 18], takes_period=False) == [
        Group(8, ("O", "Q")),
        Group(18, ("M",)),
    ]
    groups = groups_of(info, [8, 18], takes_period=True)
    assert groups == [
        Group(8, ("O",), 1, restricted=True),
        Group(8, ("Q",), 4, restricted=True),
        Group(18, ("M",), 12),
    ]
    assert [g.key for g in groups] == ["8-m1", "8-m4", "18"]
    quarterly = members_of(groups[1], [2], ["mape"], 1)[0]
    assert quarterly.run_dir(Path("o")) == Path("o/h8-m4/L16-mape-s1")
    overrides = training_overrides(quarterly, "competition_cpu", Path("s"), Path("o"), ["x=1"])
    assert "model.options.seasonal_period=4" in overrides
    assert 'sampler.options.labels=["Q"]' in overrides and overrides[-1] == "x=1"
    monthly = members_of(groups[2], [2], ["mape"], 1)[0]
    overrides = training_overrides(monthly, "competition_cpu", Path("s"), Path("o"), [])
    assert "model.options.seasonal_period=12" in overrides  # trained on every series
    assert not any(o.startswith("sampler.options.labels") for o in overrides)
    assert monthly.run_dir(Path("o")) == Path("o/h18/L36-mape-s1")
    # a model without a seasonal period gets none
    plain = members_of(Group(8, ("O", "Q")), [2], ["smape"], 1)[0]
    assert not any(
        "seasonal_period" in o for o in training_overrides(plain, "c", Path("s"), Path("o"), [])
    )


def test_which_models_take_a_seasonal_period():
    from metadist.train.compose import compose_dict

    assert model_takes_period(compose_dict(["experiment=competition_cpu"]))
    assert not model_takes_period(compose_dict(["experiment=competition"]))
    assert model_takes_period(compose_dict(["experiment=competition", "model=seasonal_forecaster"]))


def test_a_runs_recorded_periods_replace_its_evaluation_setting(tmp_path):
    assert series_periods({"M": 12, "Q": 4}, ["M"]) == {"M": 12}  # a group's, by label
    assert series_periods({"M": 12, "Q": 4}, []) == {"M": 12, "Q": 4}
    assert series_periods({"A": 1, "B": 1}, []) == 1
    assert recorded_periods(tmp_path) is None
    write_periods(tmp_path, {"M": 12, "Q": 4})
    assert recorded_periods(tmp_path) == {"M": 12, "Q": 4}
    write_periods(tmp_path, 12)
    assert recorded_periods(tmp_path) == 12
    with pytest.raises(ValueError, match="integers >= 1"):
        write_periods(tmp_path, {"M": 0})
    (tmp_path / PERIODS_FILE).write_text('{"seasonal_period": "12"}')
    with pytest.raises(ValueError, match="does not hold seasonal periods"):
        recorded_periods(tmp_path)
    options = EvalOptions(seasonal_period={"M": 12}, seasonal_period_from="label")
    assert options.period_of("", "M") == 12


def test_each_run_records_the_period_of_the_series_its_group_forecasts(tmp_path):
    periods = {"monthly": 12, "quarterly": 4, "other": 1}
    monthly = Group(24, ("monthly",), 12)  # meta-trained on every series, forecasts monthly
    mixed = Group(8, ("other", "quarterly"))  # a model without a seasonal period
    ensembles = {g.key: members_of(g, [2], ["mape"], 1) for g in (monthly, mixed)}
    for members in ensembles.values():
        members[0].run_dir(tmp_path).mkdir(parents=True)  # trained runs
    record_periods([monthly, mixed], ensembles, tmp_path, periods)
    assert recorded_periods(ensembles["24"][0].run_dir(tmp_path)) == {"monthly": 12}
    assert recorded_periods(ensembles["8"][0].run_dir(tmp_path)) == {"other": 1, "quarterly": 4}


def test_an_adaptation_choice_made_on_another_metric_is_refused(tmp_path):
    decisions = {"4": {"choice": "adapted", "metric": "smape"}, "8-m4": {"choice": "unadapted"}}
    (tmp_path / "adaptation.json").write_text(
        json.dumps({"protocol": "validation", "horizons": decisions})
    )
    assert read_adaptation_choice(tmp_path, [4, "8-m4"], "smape") == {
        "4": "adapted",
        "8-m4": "unadapted",
    }
    with pytest.raises(ValueError, match="chose by smape, this run's primary metric is mape"):
        read_adaptation_choice(tmp_path, [4], "mape")


def test_the_cpu_recipe_names_its_experiment_and_refuses_another(capsys):
    assert RECIPES["cpu"] == ("competition_cpu", 1)
    with pytest.raises(SystemExit):
        main(["nowhere", "--recipe", "cpu", "--experiment", "competition"])
    assert "--experiment and --recipe cpu both name the experiment" in capsys.readouterr().err


def test_the_cpu_recipe_ensembles_four_lookbacks_unless_told(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "run_pipeline", lambda args, prog: seen.append(args) or 0)
    assert RECIPE_LOOKBACKS == {"default": (2.0,), "cpu": (2.0, 3.0, 4.0, 5.0)}
    for argv, lookbacks in (
        (["data", "--recipe", "cpu"], [2.0, 3.0, 4.0, 5.0]),
        (["data"], [2.0]),
        (["data", "--recipe", "cpu", "--lookbacks", "2"], [2.0]),
        (["data", "--lookbacks", "2", "4"], [2.0, 4.0]),
    ):
        assert main(argv) == 0
        assert seen[-1].lookbacks == lookbacks, argv


def test_training_progress_counts_steps_from_the_runs_records(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    assert last_step(first) == 0
    lines = [{"step": 10, "split": "train"}, {"step": 20, "split": "val"}]
    (first / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"st')
    assert last_step(first) == 20  # a line being written is skipped
    with Progress(enabled=False) as display:
        tracker = TrainingProgress(display, {first: 100, second: 50})
        assert tracker.counter.total == 150 and tracker.counter.done == 20
        tracker.end(second)  # an early stop counts all its steps
        assert tracker.counter.done == 70


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_run_trained_on_monthly_data_forecasts_theta_with_period_12(tmp_path):
    # one horizon, two periods: one ensemble per period, each on its own series
    labels = {"monthly": (6, 12, 8), "quarterly": (6, 4, 8)}
    data = _write(tmp_path / "data", labels, metric="mape")
    out = tmp_path / "out"
    command = [
        *(sys.executable, "-m", "metadist.cli", "competition", str(data), "--out", str(out)),
        *("--lookbacks", "2", "--recipe", "cpu", "--ets", "no"),
        *("trainer.meta_steps=4", "trainer.meta_batch_size=4", "trainer.eval_every=2"),
        "model.options.hidden_sizes=[8]",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = out / "h6-m12" / "L12-mape-s1"  # the metric is the loss
    config = (run_dir / "config.yaml").read_text()
    assert "seasonal_period: 12" in config and "loss: mape" in config
    assert "- monthly" in config  # meta-trained on the monthly series alone
    assert recorded_periods(run_dir) == {"monthly": 12}
    assert recorded_periods(out / "h6-m4" / "L12-mape-s1") == {"quarterly": 4}
    result = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert result["primary_metric"] == "mape" and result["num_tasks"] == 8
    decisions = json.loads((out / "adaptation.json").read_text())["horizons"]
    assert set(decisions) == {"6-m4", "6-m12"}
    assert {d["metric"] for d in decisions.values()} == {"mape"}
    pooled = json.loads((out / "metrics.json").read_text())
    assert pooled["num_tasks"] == 16 and pooled["primary_metric"] == "mape"
    history = pd.read_parquet(data / "train.parquet")
    history = history[history.series_id == "monthly0"][["series_id", "t", "value"]]
    run = metadist.load_run(run_dir)
    forecast = run.forecast(history, methods=("theta", "seasonal_naive")).to_pandas()
    values = history["value"].to_numpy()
    for method, expected in (
        ("theta", baselines.theta_forecast(values, 6, 12)),
        ("seasonal_naive", baselines.seasonal_naive_forecast(values, 6, 12)),
    ):
        got = forecast[forecast.method == method].sort_values("step")["value"].to_numpy()
        np.testing.assert_allclose(got, np.ravel(expected), rtol=1e-6)
    # a copy of the run elsewhere still forecasts a short history as the protocol does
    copy = tmp_path / "elsewhere" / "run"
    shutil.copytree(run_dir, copy)
    short = history.head(20)
    assert (
        metadist.load_run(copy)
        .forecast(short, methods=("adapted",))
        .equals(run.forecast(short, methods=("adapted",)))
    )
    # a series of a label the run was not made for gets no borrowed period: one line
    other = history.assign(frequency="quarterly")
    with pytest.raises(ValueError, match="no entry for label 'quarterly'.*pass period=M"):
        run.forecast(other, methods=("seasonal_naive",))
    assert run.forecast(other, methods=("seasonal_naive",), period=4).num_rows == 6
    # the experiment's own setting (1) would give the naive forecast instead
    assert not np.allclose(
        baselines.seasonal_naive_forecast(values, 6, 12), baselines.naive_forecast(values, 6)
    )


@pytest.mark.parametrize("experiment", ["competition", "competition_cpu"])
def test_the_competition_recipes_fit_the_meta_batch_to_a_small_panel(experiment):
    from metadist.train.compose import compose_dict

    # a panel of fewer series than a meta-batch trains (trainer.fit_meta_batch, tested on
    # real loaders in test_train_config.py) instead of stopping every training
    trainer = compose_dict([f"experiment={experiment}"])["trainer"]
    assert trainer["fit_meta_batch"] is True and trainer["meta_batch_size"] == 64


def test_a_step_run_as_a_command_is_shown_as_one_to_run_again(tmp_path, capsys):
    from metadist.commands.competition.steps import METADIST, run_command

    place = tmp_path / "a dir"
    code = run_command("check", [*METADIST, "verify", str(place)], dict(os.environ))
    assert code != 0  # no store there: the point is the line shown
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"== check: metadist verify '{place}'"
