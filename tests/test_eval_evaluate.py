"""`evaluate_tasks` on a real store: original units, baselines by hand, the report files."""

import io
import json
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from metadist import progress
from metadist.datasets.synthetic import (
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_PERIODS,
    write_synthetic_panel,
)
from metadist.eval import EvalOptions, baselines, evaluate_run, evaluate_tasks
from metadist.eval.report import markdown_report, write_report
from metadist.eval.threads import eval_threads
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.store.ingest import ingest
from metadist.tasks import build_task_sampler

LOOKBACK, HORIZON = 16, 4


@pytest.fixture(scope="module")
def panel_and_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    write_synthetic_panel(
        root / "panel", num_entities=16, length_range=(100, 140), seed=3, nan_fraction=0.0
    )
    store = ingest(
        root / "panel",
        root / "store",
        progress=False,
        **SYNTHETIC_INGEST_ARGS,
    )
    table = pq.read_table(root / "panel")
    raw = {}
    ids = np.asarray(table.column("entity_id").to_pylist())
    times = table.column("time").to_numpy()
    values = table.column("y").to_numpy()
    for name in np.unique(ids):
        keep = ids == name
        raw[str(name)] = values[keep][np.argsort(times[keep])]
    return store, raw


def _sampler_and_learner(store):
    sampler = build_task_sampler(
        "forecast",
        store,
        lookback=LOOKBACK,
        horizon=HORIZON,
        num_support=3,
        num_query=1,
        split="end",
    )
    torch.manual_seed(0)
    model = build_model("forecaster", *_shapes(store), hidden_sizes=(16,))
    learner = build_learner("maml", model, inner_steps=1, inner_lr=0.05, eval_inner_steps=3)
    return sampler, learner


def _shapes(store):
    return (LOOKBACK, store.num_columns), (HORIZON, 1)


def _evaluate(store, options, **kwargs):
    sampler, learner = _sampler_and_learner(store)
    units = np.arange(sampler.num_units)
    batches = [
        sampler.sample(units[:9], units[:9].astype(np.uint64)),
        sampler.sample(units[9:], units[9:].astype(np.uint64)),
    ]
    return evaluate_tasks(
        learner,
        batches,
        options=options,
        store=store,
        target_columns=sampler.target_columns,
        fresh_model=lambda: build_model("forecaster", *_shapes(store), hidden_sizes=(16,)),
        **kwargs,
    ), sampler


def test_naive_baselines_are_scored_in_original_units(panel_and_store):
    store, raw = panel_and_store
    options = EvalOptions(
        seasonal_period=dict(SYNTHETIC_PERIODS),
        scratch_steps=3,
        num_examples=2,
        group_by=["stratum", "label"],
    )
    (result, examples), sampler = _evaluate(store, options)
    assert result["num_tasks"] == sampler.num_units == 16
    assert "scratch" in result["methods"]
    naive_abs, snaive_smape, theta_mae, mase_terms, count = 0.0, 0.0, 0.0, 0.0, 0
    for entity in sampler.unit_entity:
        name = str(store.entity_ids[entity])
        stratum = str(store.strata[entity])
        m = SYNTHETIC_PERIODS[stratum]
        series = raw[name]
        history, truth = series[:-HORIZON], series[-HORIZON:]
        naive_abs += np.abs(truth - history[-1]).sum()
        season = history[len(history) - m :][np.arange(HORIZON) % m]
        snaive_smape += (200 * np.abs(truth - season) / (np.abs(truth) + np.abs(season))).sum()
        theta_mae += np.abs(truth - baselines.theta_forecast(history, HORIZON, m)).sum()
        scale = np.abs(history[m:] - history[:-m]).mean()
        mase_terms += (np.abs(truth - history[-1]) / scale).sum()
        count += HORIZON
    overall = result["overall"]
    assert overall["naive"]["mae"]["value"] == pytest.approx(naive_abs / count, rel=1e-4)
    assert overall["naive"]["mase"]["value"] == pytest.approx(mase_terms / count, rel=1e-4)
    assert overall["seasonal_naive"]["smape"]["value"] == pytest.approx(
        snaive_smape / count, rel=1e-4
    )
    assert overall["theta"]["mae"]["value"] == pytest.approx(theta_mae / count, rel=1e-4)
    # per-stratum tables cover every task once; examples are drawn in original units
    strata = result["groups"]["stratum"]
    assert sum(g["num_tasks"] for g in strata.values()) == 16
    for group in strata.values():  # every metric is defined on every task here
        assert group["num_scored"] == {m: group["num_tasks"] for m in result["metrics"]}
    assert len(examples) == 2
    first = examples[0]
    assert np.allclose(first["truth"], raw[first["title"].split(" ")[0]][-HORIZON:], rtol=1e-5)


def test_forecast_combinations_average_the_methods_forecasts(panel_and_store, tmp_path):
    store, raw = panel_and_store
    options = EvalOptions(
        seasonal_period=dict(SYNTHETIC_PERIODS),
        scratch_steps=2,
        num_examples=1,
        combinations=[["naive", "seasonal_naive", "theta"], ["adapted", "theta"]],
    )
    (result, examples), sampler = _evaluate(store, options)
    # the figure draws the first combination
    assert examples[0]["combination_label"] == "mean of naive, seasonal naive and Theta"
    assert examples[0]["combination"].shape == (HORIZON,)
    abs_sum, smape_sum, count = 0.0, 0.0, 0
    for entity in sampler.unit_entity:
        m = SYNTHETIC_PERIODS[str(store.strata[entity])]
        series = raw[str(store.entity_ids[entity])]
        history, truth = series[:-HORIZON], series[-HORIZON:]
        mean = (
            np.full(HORIZON, history[-1])
            + history[len(history) - m :][np.arange(HORIZON) % m]
            + baselines.theta_forecast(history, HORIZON, m)
        ) / 3
        abs_sum += np.abs(truth - mean).sum()
        smape_sum += (200 * np.abs(truth - mean) / (np.abs(truth) + np.abs(mean))).sum()
        count += HORIZON
    three = result["overall"]["naive+seasonal_naive+theta"]
    assert three["mae"]["value"] == pytest.approx(abs_sum / count, rel=1e-4)
    assert three["smape"]["value"] == pytest.approx(smape_sum / count, rel=1e-4)
    assert result["methods"]["adapted+theta"] == "mean of adapted model and Theta"
    assert result["methods"]["naive+seasonal_naive+theta"] == (
        "mean of naive, seasonal naive and Theta"
    )
    # The mean of two forecasts errs by at most the mean of their errors, point by point.
    pair = result["overall"]["adapted+theta"]["mae"]["value"]
    bound = (
        result["overall"]["adapted"]["mae"]["value"] + result["overall"]["theta"]["mae"]["value"]
    ) / 2
    assert pair <= bound + 1e-9
    assert pair != pytest.approx(result["overall"]["adapted"]["mae"]["value"])
    assert "| mean of adapted model and Theta |" in markdown_report(result)
    paths = write_report(result, tmp_path, examples)
    assert paths["figure"].stat().st_size > 0


def test_figure_draws_every_stratum_and_label_first_then_fills_up(panel_and_store):
    store, _ = panel_and_store
    sampler, learner = _sampler_and_learner(store)
    strata = np.asarray([str(store.strata[e]) for e in sampler.unit_entity])
    labels = np.asarray([str(store.labels[e]) for e in sampler.unit_entity])

    def examples(units, count):
        options = EvalOptions(
            seasonal_period=dict(SYNTHETIC_PERIODS), scratch_steps=0, num_examples=count
        )
        batch = sampler.sample(units, units.astype(np.uint64))
        _, drawn = evaluate_tasks(
            learner, [batch], options=options, store=store, target_columns=sampler.target_columns
        )
        return [tuple(e["title"].split("(")[1].rstrip(")").split(", ")) for e in drawn]

    # One stratum's tasks: the figure still fills up to num_examples.
    one = np.flatnonzero(strata == strata[0])
    assert len(one) >= 3
    assert len(examples(one, len(one))) == len(one)
    # Every stratum and every label is drawn when there is room for each.
    every = np.arange(sampler.num_units)
    drawn = examples(every, len(set(strata)) + len(set(labels)))
    assert {s for s, _ in drawn} == set(strata) and {lab for _, lab in drawn} == set(labels)


def test_bad_combinations_are_named(panel_and_store):
    for bad, match in (
        ([["adapted"]], "two or more different methods"),
        ([["adapted", "adapted"]], "two or more different methods"),
        ([["adapted", "arima"]], "unknown method 'arima'"),
        (["adapted", "theta"], "entries must be lists of methods"),
        ([["adapted", "theta"], ["theta", "adapted"]], "the same methods twice"),
        ("adapted+theta", "must be a list of method lists or null"),
    ):
        with pytest.raises(ValueError, match=match):
            EvalOptions(combinations=bad).validate()
    store, _ = panel_and_store
    sampler, learner = _sampler_and_learner(store)
    units = np.arange(4)
    batch = sampler.sample(units, units.astype(np.uint64))
    options = EvalOptions(scratch_steps=0, combinations=[["adapted", "scratch"]])
    with pytest.raises(ValueError, match="needs 'scratch', which this evaluation does not score"):
        evaluate_tasks(
            learner, [batch], options=options, store=store, target_columns=sampler.target_columns
        )
    with pytest.raises(ValueError, match="needs forecast tasks on a store"):
        evaluate_tasks(learner, [batch], options=options)


def test_zero_inner_steps_make_adapted_equal_unadapted_and_report_files(panel_and_store, tmp_path):
    store, _ = panel_and_store
    options = EvalOptions(
        inner_steps=0,
        seasonal_period=dict(SYNTHETIC_PERIODS),
        scratch_steps=0,
        num_examples=3,
        references={"Published": {"all": 1.5, "stratum": {"flow": 2.0}}},
    )
    (result, examples), _ = _evaluate(store, options)
    assert result["overall"]["adapted"] == result["overall"]["unadapted"]
    # no from-scratch row with no steps: it would be an untrained network
    assert "scratch" not in result["methods"] and "scratch" not in result["overall"]
    paths = write_report(result, tmp_path, examples)
    saved = json.loads(paths["json"].read_text())
    assert saved["overall"]["naive"]["mae"]["value"] == pytest.approx(
        result["overall"]["naive"]["mae"]["value"]
    )
    table = paths["markdown"].read_text()
    assert table == markdown_report(result)
    assert "| Published (published) |" in table
    assert "1.500" in table and "2.000" in table
    assert paths["figure"].read_bytes()[:4] == b"\x89PNG"


def test_progress_lines_off_a_terminal(panel_and_store, monkeypatch, capsys):
    store, _ = panel_and_store
    options = EvalOptions(seasonal_period=dict(SYNTHETIC_PERIODS), scratch_steps=0)
    (quiet, _), sampler = _evaluate(store, options)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    (shown, _), _ = _evaluate(store, options, progress=True, num_tasks=sampler.num_units)
    lines = capsys.readouterr().err.splitlines()
    total = sampler.num_units
    # every phase has its own lines: the tasks scored, the statistical forecasts' series
    evaluating = [line for line in lines if line.startswith("evaluating: ")]
    assert evaluating[-1].startswith(f"evaluating: {total}/{total} tasks (100%)"), lines
    assert evaluating[0].startswith(f"evaluating: 9/{total} tasks"), lines
    statistical = [line for line in lines if line.startswith("statistical forecasts: ")]
    assert statistical[-1].startswith(f"statistical forecasts: {total}/{total} forecasts"), lines
    # the time left: "estimating" until a forecast after the first is done, then measured
    assert statistical[0].endswith("estimating time left"), lines
    assert any(line.endswith(" s left") for line in statistical[1:]), lines
    assert len(evaluating) + len(statistical) == len(lines)
    assert shown["overall"] == quiet["overall"]


def test_progress_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with progress.Progress(stream=stream, transient=True) as display:
        shown = display.counter("evaluating", 20, "tasks")
        shown.update(7)
        assert display._rich.tasks[0].completed == 7 and display._rich.tasks[0].total == 20
    assert display._rich is None and shown.done == 7


def test_eval_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with eval_threads() as threads:
        assert threads == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    monkeypatch.setenv("OMP_NUM_THREADS", str(before))
    with eval_threads() as threads:
        assert threads == before == torch.get_num_threads()


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="eval.scratch_lr"):
        EvalOptions(scratch_lr=0).validate()
    with pytest.raises(ValueError, match="eval.bogus"):
        EvalOptions.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="no entry for stratum 'flow'"):
        EvalOptions(seasonal_period={"temperature": 24}).period_of("flow")


def test_missing_checkpoint_points_at_a_run_inside(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no checkpoint yet; train first"):
        evaluate_run(tmp_path)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("{}")
    (tmp_path / "data").mkdir()
    with pytest.raises(FileNotFoundError) as caught:
        evaluate_run(tmp_path)
    message = str(caught.value)
    assert "contains a run that has" in message and f"run_dir={tmp_path / 'run'})" in message
    assert "train first" not in message and "data" not in message.split("(")[-1]


def test_classification_accuracy_with_confidence_interval(panel_and_store):
    store, _ = panel_and_store
    sampler = build_task_sampler(
        "nway_kshot", store, num_ways=2, num_shots=1, num_query=1, class_by="stratum", lookback=16
    )
    torch.manual_seed(0)
    model = build_model("mlp", (16, store.num_columns), (8,), hidden_sizes=(16,))
    learner = build_learner("protonet", model)
    units = np.arange(min(sampler.num_units, 12))
    batch = sampler.sample(units, units.astype(np.uint64))
    result, examples = evaluate_tasks(learner, [batch], options=EvalOptions(), store=store)
    assert result["kind"] == "classification" and examples == []
    # protonet has no inner loop, so no "unadapted" row; the raw-example baselines join.
    assert set(result["overall"]) == {"adapted", "nearest_centroid", "one_nn"}
    with torch.no_grad():
        logits = learner.predict(learner.adapt(batch.support), batch.query.x)
    per_task = (logits.argmax(-1) == batch.query.y).double().mean(dim=1).numpy()
    score = result["overall"]["adapted"]["accuracy"]
    assert score["value"] == pytest.approx(per_task.mean())
    assert score["ci95"] == pytest.approx(
        1.959963984540054 * per_task.std(ddof=1) / np.sqrt(len(per_task))
    )
    assert "| meta-trained + adapted |" in markdown_report(result)


def test_combined_runs_pool_like_one_evaluation(panel_and_store, tmp_path):
    from metadist.commands.combine import main as combine_main
    from metadist.eval.combine import combine_runs

    store, _ = panel_and_store
    options = EvalOptions(
        seasonal_period=dict(SYNTHETIC_PERIODS),
        scratch_steps=0,
        num_examples=0,
        group_by=["stratum", "label"],
        combinations=[["adapted", "theta"]],
    )
    sampler, learner = _sampler_and_learner(store)
    units = np.arange(sampler.num_units)
    whole, _ = evaluate_tasks(
        learner,
        [sampler.sample(units, units.astype(np.uint64))],
        options=options,
        store=store,
        target_columns=sampler.target_columns,
    )
    # The same tasks in two runs: the first 5 and the other 11 (other group mixes).
    for name, part in (("a", units[:5]), ("b", units[5:])):
        result, _ = evaluate_tasks(
            learner,
            [sampler.sample(part, part.astype(np.uint64))],
            options=options,
            store=store,
            target_columns=sampler.target_columns,
        )
        write_report(result, tmp_path / name)
    tasks = pq.read_table(tmp_path / "a" / "eval" / "tasks.parquet")
    assert tasks.num_rows == 5 and "group:entity" in tasks.column_names
    assert "per_task" not in json.loads((tmp_path / "a" / "eval" / "metrics.json").read_text())

    combined = combine_runs([tmp_path / "a", tmp_path / "b"], title="both")
    assert combined["num_tasks"] == 16
    for method, scores in whole["overall"].items():
        for metric, score in scores.items():
            for key in ("value", "task_mean", "ci95"):
                assert combined["overall"][method][metric][key] == pytest.approx(score[key])
    assert combined["groups"].keys() == whole["groups"].keys() == {"stratum", "label"}
    for grouping, groups in whole["groups"].items():
        for group, entry in groups.items():
            got = combined["groups"][grouping][group]
            assert got["num_tasks"] == entry["num_tasks"]
            assert got["scores"]["naive"]["smape"] == pytest.approx(
                entry["scores"]["naive"]["smape"]
            )

    assert combine_main([str(tmp_path / "both"), str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    table = (tmp_path / "both" / "metrics.md").read_text()
    assert "| naive (last value) |" in table and "| mean of adapted model and Theta |" in table
    with pytest.raises(ValueError, match="is evaluated by both"):
        combine_runs([tmp_path / "a", tmp_path / "both"])
    with pytest.raises(FileNotFoundError, match="metadist eval run_dir="):
        combine_runs([tmp_path / "a", tmp_path / "missing"])
    with pytest.raises(ValueError, match="at least one run directory"):
        combine_runs([])
    # one run pools to its own figures (a competition of one horizon)
    one = combine_runs([tmp_path / "a"])
    alone_eval = json.loads((tmp_path / "a" / "eval" / "metrics.json").read_text())
    for method, scores in alone_eval["overall"].items():
        for metric, score in scores.items():
            assert one["overall"][method][metric]["value"] == pytest.approx(score["value"])

    # The model as chosen per run: a's adapted tasks and points, b's unadapted ones.
    picked = combine_runs([tmp_path / "a", tmp_path / "b"], chosen=["adapted", "unadapted"])
    assert next(iter(picked["methods"])) == "chosen"
    rows = picked["per_task"]
    sums = np.r_[rows["adapted:smape"][:5], rows["unadapted:smape"][5:]]
    assert rows["chosen:smape"] == sums.tolist()
    expected = sums.sum() / np.sum(rows["num_points"])
    assert picked["overall"]["chosen"]["smape"]["value"] == pytest.approx(expected)
    assert picked["overall"]["adapted"] == combined["overall"]["adapted"]
    points = picked["forecasts"]
    first = sum(1 for e in points["entity"] if e in set(rows["group:entity"][:5]))
    assert points["chosen"] == points["adapted"][:first] + points["unadapted"][first:]
    assert picked["settings"]["chosen"] == {
        str(tmp_path / "a"): "adapted",
        str(tmp_path / "b"): "unadapted",
    }
    alone = combine_runs([tmp_path / "b"], chosen=["unadapted"])
    assert alone["overall"]["chosen"]["mase"] == alone["overall"]["unadapted"]["mase"]
    with pytest.raises(ValueError, match="scored no method 'tuned'"):
        combine_runs([tmp_path / "a", tmp_path / "b"], chosen=["adapted", "tuned"])
    with pytest.raises(ValueError, match="1 chosen method"):
        combine_runs([tmp_path / "a", tmp_path / "b"], chosen=["adapted"])


# ---------------------------------------------------------------- seasonal adjustment
def _seasonal_with_zeros(n=40, m=4):
    t = np.arange(n)
    pattern = np.array([6.0, -2.0, 0.0, -4.0])
    return 0.2 * t + pattern[t % m] + np.where(t % 7 == 0, 0.5, 0.0)


def test_additive_seasonal_indices_match_a_hand_computed_classical_decomposition():
    """Values <= 0: the indices are additive — the mean difference from the centred
    (2 x 4) moving average at each season position, centred on 0 — as statsmodels'
    additive classical decomposition computes them."""
    from metadist.eval.baselines import seasonal_indices

    y = _seasonal_with_zeros()
    indices, kind = seasonal_indices(y, 4)
    assert kind == "additive"
    diffs = {p: [] for p in range(4)}
    for i in range(2, len(y) - 2):  # 2x4 centred moving average by hand
        trend = (0.5 * y[i - 2] + y[i - 1] + y[i] + y[i + 1] + 0.5 * y[i + 2]) / 4
        diffs[i % 4].append(y[i] - trend)
    means = np.array([np.mean(diffs[p]) for p in range(4)])
    np.testing.assert_allclose(indices, means - means.mean(), atol=1e-12)
    statsmodels = pytest.importorskip("statsmodels.tsa.seasonal")
    reference = statsmodels.seasonal_decompose(y, model="additive", period=4).seasonal[:4]
    np.testing.assert_allclose(indices, reference, atol=1e-10)
    # all positive: multiplicative, as before
    assert seasonal_indices(y + 100.0, 4)[1] == "multiplicative"


def test_theta_and_naive2_adjust_a_series_with_zeros_additively():
    """Theta on a seasonal series with values <= 0 is Theta on the additively adjusted
    series with the indices added back (it used to skip seasonality there)."""
    from metadist.eval.baselines import naive2_forecast, seasonal_indices, theta_forecast

    y = _seasonal_with_zeros()
    n, h = len(y), 6
    indices, _ = seasonal_indices(y, 4)
    adjusted = y - indices[np.arange(n) % 4]
    ahead = indices[(n + np.arange(h)) % 4]
    np.testing.assert_allclose(theta_forecast(y, h, 4), theta_forecast(adjusted, h, 1) + ahead)
    np.testing.assert_allclose(naive2_forecast(y, h, 4), adjusted[-1] + ahead)
    # The adjustment matters: seasonal errors far below the unadjusted forecast's.
    future = 0.2 * (n + np.arange(h)) + np.array([6.0, -2.0, 0.0, -4.0])[(n + np.arange(h)) % 4]
    adjusted_error = np.abs(theta_forecast(y, h, 4) - future).mean()
    assert adjusted_error < 0.5 * np.abs(theta_forecast(y, h, 1) - future).mean()
    # Non-seasonal at m = 1: naive 2 is the naive forecast.
    np.testing.assert_allclose(naive2_forecast(y, h, 1), np.full(h, y[-1]))


def test_ets_baseline_is_statsforecast_autoets():
    models = pytest.importorskip("statsforecast.models")
    from metadist.eval.baselines import ets_forecast

    rng = np.random.default_rng(0)
    y = 50 + np.cumsum(rng.normal(0, 1, 48)) + 5 * np.sin(np.arange(48) * np.pi / 6)
    expected = models.AutoETS(season_length=12).forecast(y=y, h=8)["mean"]
    np.testing.assert_allclose(ets_forecast(y, 8, 12), expected)
    two = ets_forecast(np.stack([y, y + 10], axis=1), 8, 12)
    assert two.shape == (8, 2)
    # A short series on which statsforecast's fit divides by zero degrees of freedom: its
    # numerical warnings are not passed on (the forecast is checked for finiteness).
    short = np.random.default_rng(0).random(7) * 10 + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forecast = ets_forecast(short, 4, 1)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert forecast.shape == (4,) and np.isfinite(forecast).all()


def test_markdown_has_mase_and_owa_by_group_with_references_only_for_the_primary_metric():
    def score(value, num_tasks=3):
        return {"value": value, "ci95": 0.0, "num_tasks": num_tasks}

    def scores(smape, mase, owa):
        return {"smape": smape, "mase": mase, "owa": owa, "mae": 1.0}

    groups = {
        "A": {"num_tasks": 2, "num_scored": {"mase": 1}, "scores": {"model": scores(10.0, 0.71, 0.81), "theta": scores(11.0, 0.72, 0.82)}},
        "B": {"num_tasks": 1, "scores": {"model": scores(20.0, 1.31, 0.91), "theta": scores(19.0, 1.32, 0.92)}},
    }  # fmt: skip
    result = {
        "kind": "forecast",
        "num_tasks": 3,
        "metrics": ["smape", "mase", "owa", "mae"],
        "primary_metric": "smape",
        "primary_metric_label": "sMAPE",
        "methods": {"model": "the model", "theta": "Theta method"},
        "overall": {
            m: {k: score(v, 2 if k == "mase" else 3) for k, v in scores(12.0, 0.91, 0.85).items()}
            for m in ("model", "theta")
        },
        "groups": {"group": groups},
        "references": {"Theta": {"all": 13.01, "group": {"A": 9.5, "B": 18.5}}},
    }
    text = markdown_report(result)
    sections = {s.split("\n", 1)[0]: s for s in text.split("\n## ")[1:]}
    assert list(sections) == ["sMAPE by group", "MASE by group", "OWA by group"]
    # the main table carries the published overall figure, in the primary metric's column
    main_rows = text.split("\n## ")[0].splitlines()
    assert "| Theta (published) | 13.01 |  |  |  |  |" in main_rows
    assert "Theta (published)" in sections["sMAPE by group"]
    assert "| A | 2 | 10.00 | 11.00 | 9.500 |" in sections["sMAPE by group"]
    assert "(published)" not in sections["MASE by group"] + sections["OWA by group"]
    # each table counts the tasks its metric is defined on (a constant history has no MASE)
    assert "| A | 1 | 0.710 | 0.720 |" in sections["MASE by group"]
    assert "| **all** | 2 |" in sections["MASE by group"]
    assert "| **all** | 3 |" in sections["sMAPE by group"]
    assert "| B | 1 | 0.910 | 0.920 |" in sections["OWA by group"]
    # MAE is not scale-free: no table of it by group
    assert "MAE by" not in text
