"""`metadist.load_run`: adapt a trained run to new entities from their own history.

Real parts: a synthetic panel written as Parquet, ingested into stores, runs trained by
`metadist train`, forecasts compared with what evaluation computes on the same history.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

import metadist
from metadist.datasets.synthetic import (
    SYNTHETIC_ENTITY,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_TIME,
    write_synthetic_panel,
)
from metadist.eval.plausibility import GUARD_FILE, guard, write_guard
from metadist.store import SeriesStore
from metadist.store.ingest import ingest
from metadist.train.artifact import INFERENCE_FILE

pytestmark = pytest.mark.integration
H = 8  # the synthetic_maml sampler's horizon


def _train(tmp: Path, store: Path, name: str, *extra: str) -> Path:
    from metadist.cli import main

    run_dir = tmp / name
    code = main(
        [
            "train",
            "experiment=synthetic_maml",
            f"data.store={store}",
            f"run_dir={run_dir}",
            "trainer.meta_steps=3",
            "trainer.meta_batch_size=4",
            "trainer.checkpoint_every=3",
            "trainer.eval_every=0",
            "logging.wandb.mode=disabled",
            "logging.progress=false",
            "--no-eval",
            *extra,
        ]
    )
    assert code == 0
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    panel = tmp / "panel"
    write_synthetic_panel(panel, num_entities=40, length_range=(120, 200), seed=3, nan_fraction=0)
    stores = {}
    for scaling, nan in (("global", "error"), ("per-entity", "ffill")):
        args = {**SYNTHETIC_INGEST_ARGS, "scaling": scaling, "nan": nan}
        stores[scaling] = tmp / f"store-{scaling}"
        ingest(panel, stores[scaling], progress=False, **args)
    return {
        "panel": panel,
        "global": _train(tmp, stores["global"], "global"),
        "per-entity": _train(tmp, stores["per-entity"], "per_entity"),
        "stores": stores,
    }


def _panel_rows(panel: Path, entity: str) -> pa.Table:
    table = pq.read_table(panel, filters=[(SYNTHETIC_ENTITY, "=", entity)])
    return table.sort_by(SYNTHETIC_TIME)


def test_forecast_equals_the_evaluations_adapted_forecast(runs):
    run = metadist.load_run(runs["global"])
    assert run.kind == "forecast"
    source, learner = run.source, run.learner
    store = source.store
    units = source.partitioner.units("test")
    tasks = source.sampler.for_evaluation(
        units, split="test", tasks_per_unit=1, max_tasks=None, seed=0
    )
    batch = next(iter(tasks.batches(4, 0)))
    with torch.no_grad():
        params = learner.adapt(batch.support, steps=run.eval_options.inner_steps)
        scaled = learner.predict(params, batch.query.x)[:, 0].double().numpy()
    columns = list(source.sampler.target_columns)
    for b in range(len(batch.entity_index)):
        entity = int(batch.entity_index[b])
        evaluated = store.scaler.inverse(scaled[b], entity, columns)
        key = str(store.entity_ids[entity])
        rows = _panel_rows(runs["panel"], key)
        history = rows.slice(0, rows.num_rows - H)  # evaluation adapts on all but the last H
        table = run.forecast(history)
        assert table.column("method").to_pylist() == ["adapted"] * H
        assert table.column("step").to_pylist() == list(range(1, H + 1))
        forecast = np.column_stack(
            [table.column(store.column_names[c]).to_numpy() for c in columns]
        )
        np.testing.assert_allclose(forecast, evaluated, rtol=1e-5, atol=1e-5)
        times = rows.column(SYNTHETIC_TIME).to_numpy()
        assert table.column(SYNTHETIC_TIME).to_pylist() == times[-H:].tolist()


def test_a_new_entity_gets_forecasts_in_its_own_units(runs):
    """Per-entity scaling from the entity's own history: an affine copy of a series (a
    new sensor, 1000 times larger and shifted) gets the affine copy of its forecasts."""
    run = metadist.load_run(runs["per-entity"])
    store = run.source.store
    key = str(store.entity_ids[0])
    history = _panel_rows(runs["panel"], key)
    copy = {name: history.column(name).to_numpy() for name in history.column_names}
    copy[SYNTHETIC_ENTITY] = np.array(["brand-new-sensor"] * history.num_rows, dtype=object)
    for name in store.column_names:
        copy[name] = 1000.0 * copy[name] + 5.0
    both = pa.concat_tables([history, pa.table(copy, schema=history.schema)])
    table = run.forecast(both, methods=["adapted", "naive"]).to_pandas()
    target = store.column_names[run.source.sampler.target_columns[0]]
    for method in ("adapted", "naive"):
        rows = table[table.method == method]
        original = rows[rows[SYNTHETIC_ENTITY] == key][target].to_numpy()
        scaled = rows[rows[SYNTHETIC_ENTITY] == "brand-new-sensor"][target].to_numpy()
        np.testing.assert_allclose(scaled, 1000.0 * original + 5.0, rtol=1e-4)
    assert not store.entity_ids.tolist().count("brand-new-sensor")


def test_a_recorded_guard_clips_the_models_forecasts(runs, capsys):
    """A run recording a plausibility band (`guard.json`, as `metadist competition`
    writes it where validation chose one) serves its model's forecasts within each
    entity's band; the baselines stay as they are."""
    run_dir = runs["global"]
    store = metadist.load_run(run_dir).source.store
    key = str(store.entity_ids[2])
    history = _panel_rows(runs["panel"], key)
    methods = ["adapted", "unadapted", "naive"]
    plain = metadist.load_run(run_dir).forecast(history, methods=methods, period=1).to_pandas()
    try:
        write_guard(run_dir, 0.0, model="unadapted")
        capsys.readouterr()
        table = metadist.load_run(run_dir).forecast(history, methods=methods, period=1)
        note = capsys.readouterr().err
        unguarded = (
            metadist.load_run(run_dir)
            .forecast(history, methods=methods, period=1, guard=False)
            .to_pandas()
        )
        chosen = metadist.load_run(run_dir).forecast(history, period=1).to_pandas()
        assert "forecasting with unadapted, the model the competition chose" in (
            capsys.readouterr().err
        )
    finally:
        (run_dir / GUARD_FILE).unlink()
    guarded = table.to_pandas()
    target = store.target_names[0]
    past = history.column(target).to_numpy()
    for method in methods:
        before = plain[plain.method == method][target].to_numpy()
        after = guarded[guarded.method == method][target].to_numpy()
        expected = before if method == "naive" else guard(before, past, 1, 0.0)
        np.testing.assert_allclose(after, expected, rtol=1e-6)
    before = plain[plain.method == "adapted"][target].to_numpy()
    assert not np.allclose(guard(before, past, 1, 0.0), before)  # the band binds here
    # the table and a line say which points the guard moved; guard=False turns it off
    moved = guarded[target].to_numpy() != plain[target].to_numpy()
    np.testing.assert_array_equal(guarded["clipped"].to_numpy(), moved)
    assert f"clipped {int(moved.sum())} of {2 * H} model forecast points" in note
    assert "clipped" not in plain.columns and "clipped" not in unguarded.columns
    np.testing.assert_array_equal(unguarded[target].to_numpy(), plain[target].to_numpy())
    # a recorded choice of the model is forecast unless methods says otherwise
    np.testing.assert_array_equal(chosen.method.unique(), ["unadapted"])
    np.testing.assert_allclose(
        chosen[target].to_numpy(), guarded[guarded.method == "unadapted"][target].to_numpy()
    )


def test_methods_and_combinations(runs):
    run = metadist.load_run(runs["global"])
    key = str(run.source.store.entity_ids[1])
    history = _panel_rows(runs["panel"], key)
    table = run.forecast(history, methods=["adapted", "theta", "adapted+theta"], period=24)
    frame = table.to_pandas()
    target = run.source.store.column_names[run.source.sampler.target_columns[0]]
    by = {m: frame[frame.method == m][target].to_numpy() for m in frame.method.unique()}
    np.testing.assert_allclose(by["adapted+theta"], (by["adapted"] + by["theta"]) / 2)
    longer = run.forecast(history, horizon=3)
    assert longer.num_rows == 3


def test_a_period_longer_than_the_history_is_noted(runs, capsys):
    """Seasonal naive and Theta fall back to no seasonality there: a note says so (a
    constant forecast came back without a word)."""
    run = metadist.load_run(runs["global"])
    history = _panel_rows(runs["panel"], str(run.source.store.entity_ids[1]))
    capsys.readouterr()
    run.forecast(history, methods=["seasonal_naive", "theta"], period=10**4)
    err = capsys.readouterr().err
    assert "1 entity is too short for period 10000" in err and "Theta 2 seasons" in err
    run.forecast(history, methods=["seasonal_naive"], period=24)
    assert "too short" not in capsys.readouterr().err
    for bad in (0, -1, 2.5, True):  # whatever the methods (it was taken without one)
        with pytest.raises(ValueError, match="period must be an integer >= 1"):
            run.forecast(history, methods=["naive"], period=bad)
    assert run.forecast(history, methods=["seasonal_naive"], period=np.int64(24)).num_rows == H
    # period 1 has no seasonality to fall back from: no note however short the history
    run.forecast(history.slice(0, 2), methods=["naive", "theta"], period=1)
    assert "too short" not in capsys.readouterr().err


def test_an_ensemble_forecasts_the_mean_of_its_members(runs, tmp_path):
    """`load_run(..., ensemble=[...])`: each member adapts on the entity's own windows and
    the ensemble's forecast is the mean of the members' forecasts (eval.ensemble_reduce)."""
    store = runs["stores"]["global"]
    other = _train(tmp_path, store, "seed1", "trainer.seed=1")
    key = str(SeriesStore.open(store).entity_ids[4])
    history = _panel_rows(runs["panel"], key)
    target = metadist.load_run(runs["global"]).source.store.target_names[0]

    def forecast(run_dir, **kwargs):
        table = metadist.load_run(run_dir, **kwargs).forecast(history, methods=["adapted"])
        return table.column(target).to_numpy()

    alone, member = forecast(runs["global"]), forecast(other)
    together = forecast(runs["global"], ensemble=[other])
    assert not np.allclose(alone, member)  # two different models
    np.testing.assert_allclose(together, (alone + member) / 2, rtol=1e-5, atol=1e-5)
    with pytest.raises(
        ValueError, match="eval.ensemble: .* was trained on another store than the evaluated run's"
    ):
        metadist.load_run(runs["global"], ensemble=[runs["per-entity"]])


def test_a_store_that_moved_is_named_with_store(runs, tmp_path):
    import shutil

    before, after = tmp_path / "store", tmp_path / "moved"
    shutil.copytree(runs["stores"]["global"], before)
    run_dir = _train(tmp_path, before, "run")
    before.rename(after)
    (run_dir / INFERENCE_FILE).unlink(missing_ok=True)  # as a run trained before records
    with pytest.raises(FileNotFoundError, match=r"pass store=PATH \(metadist forecast --store"):
        metadist.load_run(run_dir)
    key = str(SeriesStore.open(after).entity_ids[5])
    history = _panel_rows(runs["panel"], key)
    assert metadist.load_run(run_dir, store=after).forecast(history).num_rows == H
    with pytest.raises(ValueError, match="is not the store run_dir .* was trained on"):
        metadist.load_run(run_dir, store=runs["stores"]["per-entity"])
    # a store given where there is none is named as given (the run's config was blamed)
    from metadist.eval import evaluate_run

    for call in (metadist.load_run, evaluate_run):
        with pytest.raises(FileNotFoundError, match=rf"^store {before} \(store=PATH"):
            call(run_dir, store=before)
    # one that is there but unreadable says why (not "no series store there")
    shutil.copytree(after, before)
    meta = json.loads((before / "metadata.json").read_text())
    (before / "metadata.json").write_text(json.dumps({**meta, "format_version": 999}))
    with pytest.raises(ValueError, match=rf"^store {before} \(store=PATH, --store PATH\): "):
        metadist.load_run(run_dir, store=before)
    shutil.rmtree(before)
    path = tmp_path / "new.parquet"
    pq.write_table(history, path)
    command = [sys.executable, "-m", "metadist.cli", "forecast", str(run_dir), str(path)]
    out = tmp_path / "forecasts.parquet"
    done = subprocess.run(
        [*command, "--out", str(out), "--store", str(after)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"forecasts of 1 entity written to {out}"


def test_bad_history_is_one_clear_error(runs, capsys):
    run = metadist.load_run(runs["global"])
    key = str(run.source.store.entity_ids[2])
    history = _panel_rows(runs["panel"], key)
    with pytest.raises(ValueError, match="history has no column 'load'"):
        run.forecast(history.drop(["load"]))
    # too short for the run's windows: front-filled on fewer windows, said in one line
    # whose arithmetic adds up (L + H + (K-1)*stride - padded)
    capsys.readouterr()
    assert run.forecast(history.slice(0, 20)).num_rows == H
    note = capsys.readouterr().err
    assert "1 entity has fewer than" in note and f"('{key}', the first with 20)" in note
    numbers = re.search(r"= (\d+) \+ (\d+) \+ (\d+)\*(\d+) - (\d+) = (\d+) rows", note)
    assert numbers is not None, note
    lookback, horizon, k1, stride, pad, needed = map(int, numbers.groups())
    assert lookback + horizon + k1 * stride - pad == needed > 20
    values = history.column("y").to_numpy().copy()
    values[5] = np.nan
    broken = history.set_column(history.column_names.index("y"), "y", pa.array(values))
    with pytest.raises(ValueError, match=f"entity '{key}' has nan in column 'y'.*--nan error"):
        run.forecast(broken)
    doubled = pa.concat_tables([history.slice(0, 60), history.slice(59, 1)])
    with pytest.raises(ValueError, match="has two rows at time="):
        run.forecast(doubled)
    with pytest.raises(ValueError, match="unknown forecast method 'thetta'"):
        run.forecast(history, methods=["thetta"])
    per_entity = metadist.load_run(runs["per-entity"])
    empty = history.set_column(
        history.column_names.index("y"), "y", pa.array(np.full(history.num_rows, np.nan))
    )
    with pytest.raises(ValueError, match="has no finite value in column 'y'"):
        per_entity.forecast(empty)


def test_metadist_forecast_command(runs, tmp_path):
    key = str(SeriesStore.open(runs["stores"]["global"]).entity_ids[3])
    history = tmp_path / "new.parquet"
    pq.write_table(_panel_rows(runs["panel"], key), history)
    out = tmp_path / "out" / "forecasts.parquet"
    command = [sys.executable, "-m", "metadist.cli", "forecast", str(runs["global"]), str(history)]
    done = subprocess.run(
        [*command, "--out", str(out), "--methods", "adapted,naive"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    assert table.num_rows == 2 * H and set(table.column("method").to_pylist()) == {
        "adapted",
        "naive",
    }
    bad = subprocess.run(
        [*command, "--out", str(tmp_path / "x.parquet"), "--methods", "magic"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().endswith("combination such as adapted+theta")
    assert not (tmp_path / "x.parquet").exists()
    bad = subprocess.run([*command, "--out", str(out), "--period", "0"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.strip().endswith("--period must be >= 1, got 0")
    # --out under a file, however deep: one line before any work (a traceback after it)
    (tmp_path / "a_file").write_text("")
    for place in ("a_file/x.parquet", "a_file/sub/x.parquet"):
        bad = subprocess.run(
            [*command, "--out", str(tmp_path / place)], capture_output=True, text=True, timeout=120
        )
        assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
        assert bad.stderr.strip().endswith(f"{tmp_path / 'a_file'} is a file, not a directory")


def test_classify_with_a_few_shot_classifier(runs, tmp_path):
    from metadist.cli import main

    run_dir = tmp_path / "protonet"
    code = main(
        [
            "train",
            "experiment=synthetic_protonet",
            f"data.store={runs['stores']['per-entity']}",
            f"run_dir={run_dir}",
            "trainer.meta_steps=2",
            "trainer.meta_batch_size=2",
            "trainer.checkpoint_every=2",
            "trainer.eval_every=0",
            "data.split_by=unit",
            "sampler.options.class_by=stratum",
            "sampler.options.num_ways=2",
            "sampler.options.num_query=1",
            "logging.wandb.mode=disabled",
            "logging.progress=false",
            "--no-eval",
        ]
    )
    assert code == 0
    run = metadist.load_run(run_dir)
    assert run.kind == "classification"
    store = run.source.store
    with pytest.raises(ValueError, match="is a classification run"):
        run.forecast(_panel_rows(runs["panel"], str(store.entity_ids[0])))
    examples, labels = [], []
    for entity in range(6):
        rows = _panel_rows(runs["panel"], str(store.entity_ids[entity]))
        examples.append(np.column_stack([rows.column(c).to_numpy() for c in store.column_names]))
        labels.append(f"class-{entity % 3}-{entity}")
    # 1-shot prototypes: each support example is its own class's prototype, at distance 0
    predicted = run.classify(examples, labels, examples)
    assert predicted.tolist() == labels
    with pytest.raises(ValueError, match="support_labels has 2 labels for 6 support examples"):
        run.classify(examples, labels[:2], examples)
    with pytest.raises(ValueError, match=r"query_x\[0\] has 3 rows; the run reads 32"):
        run.classify(examples, labels, [examples[0][:3]])
    # one line each, not a traceback: an empty example, a ragged one, labels as a string
    with pytest.raises(ValueError, match=r"support_x\[0\] has shape \(0, \d+\)"):
        run.classify([examples[0][:0], *examples[1:]], labels, examples)
    with pytest.raises(ValueError, match=r"query_x\[0\] is not an array of numbers"):
        run.classify(examples, labels, [[[1.0, 2.0], [3.0]]])
    with pytest.raises(ValueError, match="support_labels is one string"):
        run.classify(examples[:3], "abc", examples)
    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match=f"steps must be an integer >= 0, got {bad}"):
            run.classify(examples, labels, examples, steps=bad)
    # a network with a row per way labels at most the ways it was trained with
    maml_dir = tmp_path / "maml"
    overrides = [a for a in (
        "train", "experiment=synthetic_protonet", f"data.store={runs['stores']['per-entity']}",
        f"run_dir={maml_dir}", "trainer.meta_steps=2", "trainer.meta_batch_size=2",
        "trainer.checkpoint_every=2", "trainer.eval_every=0", "data.split_by=unit",
        "sampler.options.class_by=stratum", "sampler.options.num_ways=2",
        "sampler.options.num_query=1", "logging.wandb.mode=disabled", "logging.progress=false",
        "--no-eval", "learner=maml", "model.output_shape=null", "learner.options.loss=cross_entropy",
    )]  # fmt: skip
    assert main(overrides) == 0
    maml = metadist.load_run(maml_dir)
    two = [e for e, label in zip(examples, labels, strict=True) if label[6] in "01"]
    assert len(maml.classify(two, [name[:7] for name in labels if name[6] in "01"], examples)) == 6
    with pytest.raises(ValueError, match="support_labels has 3 classes; .*trained 2-way"):
        maml.classify(examples, [label[:7] for label in labels], examples)
    # an ensemble of such runs too
    second = [o if not o.startswith("run_dir=") else f"run_dir={maml_dir}2" for o in overrides]
    assert main([*second, "trainer.seed=1"]) == 0
    both = metadist.load_run(maml_dir, ensemble=[f"{maml_dir}2"])
    with pytest.raises(ValueError, match="support_labels has 3 classes; .*trained 2-way"):
        both.classify(examples, [label[:7] for label in labels], examples)


def test_bad_values_are_refused_or_handled_by_the_stores_rule_never_silently(runs, capsys):
    """inf and NaN follow the store's --nan rule as ingest does (an error, or filled with a
    note); a value the scaling cannot hold is refused as ingest refuses it."""
    run = metadist.load_run(runs["global"])  # --nan error, global scaling
    key = str(run.source.store.entity_ids[2])
    history = _panel_rows(runs["panel"], key)
    at = history.column_names.index("y")

    def with_y(index: int, value: float) -> pa.Table:
        values = history.column("y").to_numpy().copy()
        values[index] = value
        return history.set_column(at, "y", pa.array(values))

    with pytest.raises(ValueError, match=f"entity '{key}' has inf in column 'y' .*--nan error"):
        run.forecast(with_y(7, np.inf))
    with pytest.raises(ValueError, match=f"entity '{key}' has 1e\\+300 in column 'y' at time"):
        run.forecast(with_y(7, 1e300))
    with pytest.raises(ValueError, match="global scaling puts beyond float32"):
        run.forecast(with_y(7, 1e100))
    per_entity = metadist.load_run(runs["per-entity"])  # --nan ffill
    capsys.readouterr()
    filled = per_entity.forecast(with_y(0, np.nan)).column("y").to_numpy()
    note = capsys.readouterr().err.strip()
    assert note == (
        f"note: history: 1 non-finite values filled by the store's --nan ffill rule (the "
        f"first: entity '{key}' has nan in column 'y' at time {history.column('time')[0]})"
    )
    np.testing.assert_allclose(  # a leading NaN takes the first finite value, as in ingest
        filled, per_entity.forecast(with_y(0, history.column("y")[1].as_py())).column("y")
    )
    per_entity.forecast(with_y(9, -np.inf))
    assert "1 non-finite values filled" in capsys.readouterr().err


def test_a_history_with_a_gap_is_refused_naming_it(runs):
    run = metadist.load_run(runs["global"])
    key = str(run.source.store.entity_ids[2])
    history = _panel_rows(runs["panel"], key)
    times = history.column(SYNTHETIC_TIME).to_pylist()
    gapped = pa.concat_tables([history.slice(0, 50), history.slice(52)])
    with pytest.raises(
        ValueError,
        match=f"entity '{key}' has a gap: time {times[49]} is followed by {times[52]}, where "
        "its rows are otherwise 1 apart",
    ):
        run.forecast(gapped)


@pytest.mark.parametrize("column", [SYNTHETIC_ENTITY, SYNTHETIC_TIME])
def test_a_null_id_or_time_is_refused_naming_its_row(runs, column):
    """A null id formed an entity "None" of its own, and the entity it was cut from
    was then refused for a gap it does not have."""
    run = metadist.load_run(runs["global"])
    history = _panel_rows(runs["panel"], str(run.source.store.entity_ids[2]))
    index = history.column_names.index(column)
    values = history.column(column).to_pylist()
    values[7] = None
    broken = history.set_column(index, column, pa.array(values, history.schema.field(column).type))
    with pytest.raises(ValueError, match=rf"^history: row 7: column '{column}' is null$"):
        run.forecast(broken)


def test_times_come_back_in_the_history_type(runs):
    """Timestamps give timestamps (unit and zone kept), dates give dates, monthly data
    continues by calendar months; the forecasts do not depend on the time type."""
    run = metadist.load_run(runs["global"])
    history = _panel_rows(runs["panel"], str(run.source.store.entity_ids[3]))
    at, rows = history.column_names.index(SYNTHETIC_TIME), history.num_rows
    expected = run.forecast(history).column("y")
    hourly = pa.array(
        np.datetime64("2024-03-01T00:00:00") + np.arange(rows) * np.timedelta64(1, "h")
    ).cast(pa.timestamp("s", "UTC"))
    table = run.forecast(history.set_column(at, SYNTHETIC_TIME, hourly))
    assert table.column(SYNTHETIC_TIME).type == pa.timestamp("s", "UTC")
    last = hourly[-1].as_py()
    assert table.column(SYNTHETIC_TIME).to_pylist() == [
        last + np.timedelta64(step, "h").item() for step in range(1, H + 1)
    ]
    assert table.column("y").equals(expected)
    months = np.arange(rows) + (2000 - 1970) * 12  # month-ends from January 2000
    month_ends = (months + 1).astype("datetime64[M]").astype("datetime64[D]") - 1
    table = run.forecast(history.set_column(at, SYNTHETIC_TIME, pa.array(month_ends)))
    assert table.column(SYNTHETIC_TIME).type == pa.date32()
    following = (months[-1] + 2 + np.arange(H)).astype("datetime64[M]").astype("datetime64[D]")
    assert table.column(SYNTHETIC_TIME).to_pylist() == (following - 1).tolist()
    assert table.column("y").equals(expected)


def test_local_midnight_rows_of_a_time_zone_continue_in_it_and_a_monthly_gap_is_named(runs):
    """Monthly and daily rows at local midnight are regular in their zone's wall-clock
    time, not in UTC (daylight saving moves them by an hour): accepted, and continued
    at local midnight. A monthly history with two months missing names that gap, in
    months (the message had named the first 30-day month)."""
    run = metadist.load_run(runs["global"])
    history = _panel_rows(runs["panel"], str(run.source.store.entity_ids[3]))
    at, rows = history.column_names.index(SYNTHETIC_TIME), history.num_rows
    expected = run.forecast(history).column("y")
    zone = "Europe/Berlin"
    for unit, start in (("M", "2010-01"), ("D", "2010-03-01")):
        wall = np.datetime64(start, unit) + np.arange(rows + H)
        wall = wall.astype("datetime64[ns]")
        stamps = pc.assume_timezone(pa.array(wall), timezone=zone)
        table = run.forecast(history.set_column(at, SYNTHETIC_TIME, stamps.slice(0, rows)))
        assert table.column(SYNTHETIC_TIME).type == pa.timestamp("ns", zone)
        got = table.column(SYNTHETIC_TIME).cast(pa.int64()).to_pylist()
        assert got == stamps.slice(rows).cast(pa.int64()).to_pylist(), unit
        assert table.column("y").equals(expected)
    # a daily history that ends before daylight saving starts continues at local midnight
    wall = (np.datetime64("2020-03-28", "D") - rows + 1 + np.arange(rows + H)).astype("<M8[ns]")
    stamps = pc.assume_timezone(pa.array(wall), timezone=zone)
    table = run.forecast(history.set_column(at, SYNTHETIC_TIME, stamps.slice(0, rows)))
    got = table.column(SYNTHETIC_TIME).cast(pa.int64()).to_pylist()
    assert got == stamps.slice(rows).cast(pa.int64()).to_pylist()
    # where the clocks skip local midnight (Havana, 2024-03-10 00:00 is 01:00), the
    # forecast still takes each day once: that day at the first time it has
    havana = "America/Havana"
    wall = (np.datetime64("2024-03-08", "D") - rows + 1 + np.arange(rows)).astype("<M8[ns]")
    stamps = pc.assume_timezone(pa.array(wall), timezone=havana, ambiguous="earliest")
    table = run.forecast(history.set_column(at, SYNTHETIC_TIME, stamps))
    days = pc.local_timestamp(table.column(SYNTHETIC_TIME)).to_pylist()
    assert [d.date().isoformat() for d in days] == [
        str(np.datetime64("2024-03-09") + k) for k in range(H)
    ]
    # monthly rows at UTC midnight, shown in a zone, continue at UTC midnight
    utc = (np.datetime64("2010-01", "M") + np.arange(rows + H)).astype("<M8[ns]")
    stamps = pa.array(utc).cast(pa.timestamp("ns", "UTC")).cast(pa.timestamp("ns", zone))
    table = run.forecast(history.set_column(at, SYNTHETIC_TIME, stamps.slice(0, rows)))
    got = table.column(SYNTHETIC_TIME).cast(pa.int64()).to_pylist()
    assert got == stamps.slice(rows).cast(pa.int64()).to_pylist()
    # an hourly gap is named where it is, not at the hour daylight saving skips
    hours = np.datetime64("2020-03-29T00:00", "ns") + np.arange(rows + 1) * np.timedelta64(1, "h")
    hourly = pa.array(np.delete(hours, rows - 5)).cast(pa.timestamp("ns", "UTC"))
    before = pa.array(hours[rows - 6 : rows - 5]).cast(pa.timestamp("ns", "UTC"))
    missing = before.cast(pa.timestamp("ns", zone))[0].as_py()  # wall-clock, with its offset
    assert str(missing).endswith("+02:00")
    with pytest.raises(ValueError, match=rf"time {re.escape(str(missing))} is "
                       r"followed by .*otherwise 1 hour apart"):  # fmt: skip
        run.forecast(history.set_column(at, SYNTHETIC_TIME, hourly.cast(pa.timestamp("ns", zone))))
    months = (np.datetime64("2010-01", "M") + np.arange(rows + 2)).astype("datetime64[D]")
    kept = np.delete(months, [20, 21])  # 2011-09 and 2011-10 missing
    with pytest.raises(ValueError, match=r"time 2011-08-01 is followed by 2011-11-01, where its "
                       r"rows are otherwise 1 month apart"):  # fmt: skip
        run.forecast(history.set_column(at, SYNTHETIC_TIME, pa.array(kept)))


def test_a_horizon_beyond_the_run_is_refused_before_anything_is_allocated(runs, tmp_path):
    run = metadist.load_run(runs["global"])  # reads 6 columns, forecasts 1: no rolling
    history = _panel_rows(runs["panel"], str(run.source.store.entity_ids[3]))
    with pytest.raises(ValueError, match=r"horizon=1000000000: the run forecasts at most H=8"):
        run.forecast(history.drop(["load"]), horizon=10**9)  # before the history is read
    with pytest.raises(ValueError, match=r"horizon=801: at most 800 steps"):
        run.forecast(history, horizon=801, methods=["naive"])
    naive = run.forecast(history, horizon=20, methods=["naive"])  # baselines go further
    assert naive.num_rows == 20
    path = tmp_path / "new.parquet"
    pq.write_table(history, path)
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "forecast", str(runs["global"]), str(path)]
        + ["--out", str(tmp_path / "x.parquet"), "--horizon", "1000000000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "the run forecasts at most H=8 steps" in done.stderr


def test_the_forecast_tables_own_columns_give_way_to_the_stores():
    """A store whose time column is called `step` (or a target `method`): the table's
    horizon step and method columns take other names rather than overwrite it (the
    times were shown as `step` and the 1..H column was lost)."""
    from types import SimpleNamespace

    from metadist.api.forecasting import forecast_table
    from metadist.api.history import Entity
    from metadist.api.times import Step

    store = SimpleNamespace(
        metadata={"entity_col": "sid", "time_col": "step"}, column_names=["method"]
    )
    entity = Entity("a", np.array([10, 11, 12]), np.zeros((3, 1)), step=Step(size=1),
                    time_type=pa.int64())  # fmt: skip
    forecasts = {"naive": np.full((1, 2, 1), 5.0)}
    table = forecast_table(store, [entity], [0], 2, ["naive"], forecasts)
    assert table.column_names == ["sid", "forecast_step", "step", "forecast_method", "method"]
    assert table.column("forecast_step").to_pylist() == [1, 2]
    assert table.column("step").to_pylist() == [13, 14]
    assert table.column("method").to_pylist() == [5.0, 5.0]


def test_another_store_too_small_for_the_split_is_named_as_another_store(runs, tmp_path):
    """A store other than the run's is refused as such before anything is built from it
    (a two-series store was blamed on data.fractions by the partitioner)."""
    from metadist.eval import evaluate_run

    panel = tmp_path / "panel"
    write_synthetic_panel(panel, num_entities=2, length_range=(120, 200), seed=4, nan_fraction=0)
    small = tmp_path / "small"
    ingest(panel, small, progress=False, **SYNTHETIC_INGEST_ARGS)
    for call in (metadist.load_run, evaluate_run):
        with pytest.raises(ValueError, match="is not the store run_dir .* was trained on"):
            call(runs["global"], store=small)
