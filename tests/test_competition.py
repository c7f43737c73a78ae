"""`metadist competition`: the competition protocol on a data set unlike M3 (horizons 4,
13 and 24, upper-case labels, a category of one series, series shorter than a task)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from competition_data import LABELS, write_competition

from metadist.commands.competition import (
    CompetitionSpec,
    load_spec,
    members_of,
    scan_series,
    write_validation_split,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_competition(tmp_path_factory.mktemp("competition") / "data")


def test_horizons_periods_and_labels_come_from_the_data(data_dir):
    info = scan_series(data_dir / "train.parquet", load_spec(data_dir))
    assert info.horizons == {label: h for label, (h, *_) in LABELS.items()}
    assert info.periods == {label: m for label, (_, m, *_) in LABELS.items()}
    assert info.counts == {label: c for label, (_, _, c, *_) in LABELS.items()}
    assert info.strata["SOLO"] == 1
    assert info.labels_of(13) == ["WEEKLY"]


def test_a_data_set_config_names_other_columns_and_gives_horizons_per_label(tmp_path):
    renamed = {"series_id": "id", "t": "step", "value": "y", "frequency": "freq"}
    data = write_competition(tmp_path / "data", columns=renamed)
    table = pq.read_table(data / "train.parquet").drop(["horizon", "period"])
    pq.write_table(table, data / "train.parquet")
    with pytest.raises(ValueError, match=r"no column 'series_id' \(entity_col"):
        scan_series(data / "train.parquet", load_spec(data))
    (data / "competition.yaml").write_text(
        "entity_col: id\ntime_col: step\nvalue_col: y\nlabel_col: freq\n"
        "horizon_col: null\nperiod_col: null\n"
        "horizons: {ANNUAL: 4, WEEKLY: 13, MONTHLY: 24}\nperiods: {ANNUAL: 1, WEEKLY: 1}\n"
    )
    with pytest.raises(ValueError, match="period of freq 'MONTHLY' unknown"):
        scan_series(data / "train.parquet", load_spec(data))
    text = (data / "competition.yaml").read_text().replace("WEEKLY: 1}", "WEEKLY: 1, MONTHLY: 12}")
    (data / "competition.yaml").write_text(text)
    info = scan_series(data / "train.parquet", load_spec(data))
    assert info.horizons == {"ANNUAL": 4, "MONTHLY": 24, "WEEKLY": 13}
    (data / "competition.yaml").write_text("horizon_coll: h\n")
    with pytest.raises(ValueError, match="did you mean 'horizon_col'"):
        load_spec(data)


def test_a_label_whose_series_disagree_on_the_horizon_is_named(tmp_path):
    data = write_competition(tmp_path / "data")
    table = pq.read_table(data / "train.parquet").to_pydict()
    first = table["series_id"][0]
    table["horizon"] = [
        7 if s == first else h for s, h in zip(table["series_id"], table["horizon"], strict=True)
    ]
    import pyarrow as pa

    pq.write_table(pa.table(table), data / "train.parquet")
    with pytest.raises(ValueError, match="the series of frequency 'ANNUAL' have horizons"):
        scan_series(data / "train.parquet", load_spec(data))


def test_validation_split_holds_out_each_series_last_horizon(data_dir, tmp_path):
    spec = load_spec(data_dir)
    info = scan_series(data_dir / "train.parquet", spec)
    write_validation_split(data_dir, spec, info, tmp_path / "val")
    train = pq.read_table(data_dir / "train.parquet").to_pandas()
    val_train = pq.read_table(tmp_path / "val" / "train.parquet").to_pandas()
    val_test = pq.read_table(tmp_path / "val" / "test.parquet").to_pandas()
    for series, rows in train.groupby("series_id"):
        h = int(rows["horizon"].iloc[0])
        held = val_test[val_test.series_id == series].sort_values("t")
        kept = val_train[val_train.series_id == series]
        np.testing.assert_array_equal(held["t"], np.sort(rows["t"])[-h:])
        assert len(kept) == len(rows) - h and kept["t"].max() < held["t"].min()


def test_ensemble_members_span_lookbacks_losses_and_seeds():
    members = members_of(8, [2, 3.5], ["smape", "mape"], 2)
    assert len(members) == 8
    assert {m.lookback for m in members} == {16, 28}
    assert members[0].run_dir(Path("out")) == Path("out/h8/L16-smape-s1")
    assert CompetitionSpec().horizon_col == "horizon"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_whole_protocol_on_a_data_set_unlike_m3(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    data_dir = Path(shutil.copytree(data_dir, tmp_path / "data"))
    # published figures per label: each horizon's table holds its own, the pooled one all
    (data_dir / "competition.yaml").write_text(
        "references:\n  Winner: {all: 9.5, label: {ANNUAL: 1.25, WEEKLY: 2.25, MONTHLY: 3.25}}\n"
    )
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "competition",
        str(data_dir),
        "--out",
        str(out),
        "--lookbacks",
        "1",
        "2",
        "--ets",
        "no",
        "--jobs",
        "2",
        "trainer.meta_steps=6",
        "trainer.meta_batch_size=8",
        "trainer.eval_every=3",
        "trainer.checkpoint_every=3",
        "model.options.hidden_sizes=[8]",
        "eval.scratch_steps=2",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SOLO has too few units" in done.stdout + done.stderr  # merged, not refused
    assert "(2 models) on" in done.stdout  # an ensemble of both lookbacks was evaluated
    table = (out / "metrics.md").read_text()
    for label in LABELS:
        assert f"| {label} |" in table
    assert "Winner (published)" in table
    for figure in ("1.250", "2.250", "3.250", "9.500"):
        assert f"| {figure} |" in table or f"| {figure.rstrip('0')} |" in table, figure
    assert "| SOLO | 1 |" in table and "| OWA |" in table.replace(" | OWA | ", "| OWA |")
    result = json.loads((out / "metrics.json").read_text())
    assert result["num_tasks"] == sum(c for _, _, c, *_ in LABELS.values())
    assert {"naive2", "theta", "adapted"} <= set(result["overall"])
    assert np.isfinite(result["overall"]["adapted"]["owa"]["value"])
    points = pq.read_table(out / "forecasts.parquet").to_pandas()
    assert len(points) == sum(h * c for h, _, c, *_ in LABELS.values())
    truth = pq.read_table(data_dir / "test.parquet").to_pandas()
    np.testing.assert_allclose(np.sort(points["truth"]), np.sort(truth["value"]))
    # Short series: ANNUAL series of 9 values are scored; MONTHLY series shorter than
    # lookback + two horizons + the support windows (48 + 48 + 3 rows) give training
    # tasks once they hold two horizons and the support steps (pad_inputs = L - 1).
    from metadist.store import SeriesStore
    from metadist.tasks import build_task_sampler

    store = SeriesStore(out / "store")
    sampler = build_task_sampler(
        "forecast", store, lookback=48, horizon=24, num_support=4, num_query=1, pad_inputs=47
    )
    monthly = set(points[points.frequency == "MONTHLY"].entity)
    lengths = {str(e): len(store.series(i)) for i, e in enumerate(store.entity_ids)}
    short = [e for e in monthly if 2 * 24 + 4 <= lengths[e] < 48 + 2 * 24 + 3]
    units = {str(store.entity_ids[i]) for i in sampler.unit_entities()}
    assert short and set(short) <= units
    assert min(lengths[e] for e in set(points[points.frequency == "ANNUAL"].entity)) < 4 + 8
    # Each horizon's adapted and unadapted figures and the winner; a test run's choice
    # may not choose a test run's reported model.
    written = json.loads((out / "adaptation.json").read_text())
    assert written["protocol"] == "test" and set(written["horizons"]) == {"4", "13", "24"}
    entry = written["horizons"]["13"]
    assert entry["choice"] == ("adapted" if entry["adapted"] < entry["unadapted"] else "unadapted")
    from metadist.commands.competition import main as competition

    assert competition([str(data_dir), "--out", str(out), "--adaptation-from", str(out)]) == 1
    # Rerun: the runs found finished, not retrained; evaluated again to the same figures,
    # with the model reported per horizon as a validation run chose.
    validation = tmp_path / "val"
    validation.mkdir()
    picks = {"4": "unadapted", "13": "adapted", "24": "unadapted"}
    (validation / "adaptation.json").write_text(
        json.dumps(
            {"protocol": "validation", "horizons": {h: {"choice": c} for h, c in picks.items()}}
        )
    )
    again = subprocess.run(
        [*command, "--adaptation-from", str(validation)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("confirmed, trained before") == 6  # 3 horizons x 2 lookbacks
    # confirmed in-process: no training command was started, its log is the training's
    log = (out / "h4" / "L8-smape-s1.log").read_text()
    assert "finished 6 meta-steps" in log and "nothing to train" not in log
    rerun = json.loads((out / "metrics.json").read_text())
    assert {k: v for k, v in rerun["overall"].items() if k != "chosen"} == result["overall"]
    assert [r["run_dir"] for r in rerun["settings"]["runs"]] == [
        r["run_dir"] for r in result["settings"]["runs"]
    ]
    tasks = pq.read_table(out / "tasks.parquet").to_pandas()
    horizon_of = {label: str(h) for label, (h, *_) in LABELS.items()}
    for label, rows in tasks.groupby("group:frequency"):
        pick = picks[horizon_of[label]]
        np.testing.assert_array_equal(rows["chosen:smape"], rows[f"{pick}:smape"])
    assert (
        "model, unguarded (adaptation as chosen on validation)" in (out / "metrics.md").read_text()
    )
    # The training file edited since: its store and models are not reused.
    capsys.readouterr()
    stat = (data_dir / "train.parquet").stat()
    os.utime(data_dir / "train.parquet", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert competition([str(data_dir), "--out", str(out), "--ets", "no"]) == 1
    assert f"{out / 'store'} was not made from" in capsys.readouterr().err


def test_a_finished_run_is_confirmed_without_starting_its_training(tmp_path):
    from metadist.train import load_config, train
    from metadist.train.loop import finished_before

    run = tmp_path / "run"
    overrides = [
        "experiment=sinusoid_maml",
        "sampler.options.num_tasks=40",
        "model.options.hidden_sizes=[8]",
        "trainer.meta_batch_size=4",
        "trainer.meta_steps=2",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        f"run_dir={run}",
    ]
    assert not finished_before(overrides, run)  # nothing there yet
    train(load_config(overrides, world_size=1))
    assert finished_before(overrides, run)
    assert not finished_before([*overrides, "trainer.meta_steps=3"], run)  # a step to go
    assert not finished_before([*overrides, "trainer.seed=7"], run)  # other settings
    assert not finished_before([*overrides, "model.options.hidden_sizes=[4]"], run)
    assert not finished_before([*overrides, "no_such_key=1"], run)  # the command will say
    (run / "checkpoints" / "latest").write_text("{")  # unreadable: the command will say
    assert not finished_before(overrides, run)


def test_an_adaptation_choice_comes_from_a_validation_run_with_every_horizon(tmp_path):
    from metadist.commands.competition import read_adaptation_choice

    with pytest.raises(FileNotFoundError, match="run the validation protocol first"):
        read_adaptation_choice(tmp_path, [6])
    path = tmp_path / "adaptation.json"
    path.write_text("[1]")
    with pytest.raises(ValueError, match="is not an adaptation choice"):
        read_adaptation_choice(tmp_path, [6])
    horizons = {"6": {"choice": "adapted"}, "8": {"choice": "unadapted"}}
    path.write_text(json.dumps({"protocol": "test", "horizons": horizons}))
    with pytest.raises(ValueError, match="written by a test run"):
        read_adaptation_choice(tmp_path, [6])
    path.write_text(json.dumps({"protocol": "validation", "horizons": horizons}))
    assert read_adaptation_choice(tmp_path, [8, 6]) == {"8": "unadapted", "6": "adapted"}
    with pytest.raises(ValueError, match="no choice for horizon 18"):
        read_adaptation_choice(tmp_path, [6, 18])


def test_an_override_taken_for_a_lookback_says_where_overrides_go(data_dir, capsys):
    from metadist.commands.competition import main

    with pytest.raises(SystemExit) as stop:
        main([str(data_dir), "--lookbacks", "2", "3", "trainer.meta_steps=6"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "'trainer.meta_steps=6' is not a number" in err and "after --" in err


def test_adaptation_wins_only_where_it_is_better_and_finite(tmp_path):
    from metadist.commands.competition import read_adaptation_choice, write_adaptation_choice

    figures = {4: (9.0, 9.5), 13: (9.5, 9.0), 24: (float("nan"), 9.0), 7: (9.0, float("nan"))}
    runs = {}
    for horizon, (adapted, unadapted) in figures.items():
        run = tmp_path / f"h{horizon}"
        (run / "eval").mkdir(parents=True)
        overall = {
            "adapted": {"mase": {"value": adapted}},
            "unadapted": {"mase": {"value": unadapted}},
        }
        (run / "eval" / "metrics.json").write_text(
            json.dumps({"primary_metric": "mase", "overall": overall})
        )
        runs[horizon] = run
    decisions = write_adaptation_choice(tmp_path, runs, validation=True)
    assert {h: e["choice"] for h, e in decisions.items()} == {
        "4": "adapted",
        "13": "unadapted",
        "24": "unadapted",
        "7": "adapted",
    }
    assert decisions["4"]["metric"] == "mase" and decisions["13"]["adapted"] == 9.5
    assert read_adaptation_choice(tmp_path, [4, 24]) == {"4": "adapted", "24": "unadapted"}


def test_the_holdout_is_checked_against_each_series_horizon_before_anything_runs(
    data_dir, tmp_path, capsys
):
    import pyarrow as pa

    from metadist.commands.competition import check_holdout, main

    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    spec = load_spec(data)
    info = scan_series(data / "train.parquet", spec)
    horizons = sorted(set(info.horizons.values()))
    check_holdout(data / "test.parquet", spec, info, horizons, partial=False)  # as written
    test = pq.read_table(data / "test.parquet").to_pandas()
    monthly = sorted(test[test.frequency == "MONTHLY"].series_id.unique())
    annual = sorted(test[test.frequency == "ANNUAL"].series_id.unique())

    def write(frame):
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), data / "test.parquet")

    # a holdout one value short
    write(test.drop(test.index[test.series_id == monthly[0]][-1:]))
    with pytest.raises(
        ValueError,
        match=rf"'{monthly[0]}' \(frequency MONTHLY, horizon 24\) has 23 holdout values, not 24 \(1 of 28",
    ):
        check_holdout(data / "test.parquet", spec, info, horizons, partial=False)
    # only the horizons run are checked
    check_holdout(data / "test.parquet", spec, info, [4, 13], partial=False)
    # a series without a holdout: refused, or left out where a partial holdout is asked for
    write(test[test.series_id != annual[0]])
    with pytest.raises(ValueError, match=r"has 0 holdout values.*eval.holdout.partial=true"):
        check_holdout(data / "test.parquet", spec, info, horizons, partial=False)
    check_holdout(data / "test.parquet", spec, info, horizons, partial=True)
    # a holdout series with no training part
    extra = test[test.series_id == annual[0]].assign(series_id="NEW")
    write(pd_concat(test, extra))
    with pytest.raises(ValueError, match="series 'NEW' has holdout values but no training part"):
        check_holdout(data / "test.parquet", spec, info, horizons, partial=False)
    # a horizon given in competition.yaml that the holdout does not have: refused through
    # the command, before any output exists
    write(test)
    table = pq.read_table(data / "train.parquet").drop(["horizon"])
    pq.write_table(table, data / "train.parquet")
    (data / "competition.yaml").write_text(
        "horizon_col: null\nhorizons: {ANNUAL: 4, WEEKLY: 13, MONTHLY: 12}\n"
    )
    out = tmp_path / "out"
    assert main([str(data), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "(frequency MONTHLY, horizon 12) has 24 holdout values, not 12" in err
    assert not out.exists()
    # an evaluation override is checked before the training too
    assert main([str(data), "--out", str(out), "eval.bogus=1"]) == 1
    assert "eval.bogus: unknown field" in capsys.readouterr().err
    assert not out.exists()


def pd_concat(*frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def test_a_missing_horizon_column_says_to_unset_it_and_give_horizons(data_dir, tmp_path):
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    pq.write_table(pq.read_table(data / "train.parquet").drop(["horizon"]), data / "train.parquet")
    with pytest.raises(
        ValueError, match=r"set horizon_col: null in competition.yaml and give horizons"
    ):
        scan_series(data / "train.parquet", load_spec(data))


def test_a_rerun_refuses_outputs_made_from_another_version_of_the_data(
    data_dir, tmp_path, monkeypatch, capsys
):
    """The validation split and the store are reused only while the training file is
    the one they were made from; the banner describes the training parts in use."""
    from metadist.commands import competition
    from metadist.commands.competition import panels

    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    out = tmp_path / "val"
    # stop the pipeline at its first subprocess (the ingest): what comes before is tested
    monkeypatch.setattr(panels, "run_command", lambda title, command, env: 1)
    assert competition.main([str(data), "--validation", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    annual = LABELS["ANNUAL"]
    # the validation training parts are one horizon shorter than the data's
    shortest, longest = annual[3] - annual[0], annual[4] - annual[0]
    assert "(validation protocol)" in printed
    train = pq.read_table(out / "validation_data" / "train.parquet").to_pandas()
    lengths = train[train.frequency == "ANNUAL"].groupby("series_id").size()
    assert f"{lengths.min()}..{lengths.max()} training values" in printed
    assert shortest <= lengths.min() and lengths.max() <= longest
    assert competition.main([str(data), "--validation", "--out", str(out)]) == 1  # reused
    assert "validation split of" not in capsys.readouterr().out
    stat = (data / "train.parquet").stat()
    os.utime(data / "train.parquet", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert competition.main([str(data), "--validation", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{out / 'validation_data'} was not made from {data / 'train.parquet'}" in err
    assert "give another --out" in err
    (out / "validation_data" / "source.json").unlink()  # as an earlier version wrote it
    assert competition.main([str(data), "--validation", "--out", str(out)]) == 1
    assert "does not record which file it was made from" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_sigterm_to_a_competition_stops_every_training_it_started(data_dir, tmp_path):
    from metadist.launch.children import alive, descendants

    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "competition",
        str(data_dir),
        "--out",
        str(out),
        "--lookbacks",
        "1",
        "2",
        "--ets",
        "no",
        "--jobs",
        "2",
        "trainer.meta_steps=1000000",
        "trainer.meta_batch_size=8",
        "model.options.hidden_sizes=[8]",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    competition = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        trainings: set[int] = set()
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and len(list(out.rglob("*.log"))) < 2:
            time.sleep(0.2)  # each training member logs to <run_dir>.log
        assert len(list(out.rglob("*.log"))) >= 2, "the two trainings never started"
        time.sleep(3)
        trainings |= set(descendants(competition.pid))
        competition.send_signal(signal.SIGTERM)
        _, err = competition.communicate(timeout=150)
    finally:
        leftover = descendants(competition.pid)  # never leave a training behind, even on failure
        if competition.poll() is None:
            competition.kill()
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert competition.returncode == 128 + signal.SIGTERM, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("metadist competition: stopped by SIGTERM; "), err[-2000:]
    assert "Traceback" not in err
    for pid in trainings:
        assert not alive(pid), f"process {pid} outlived metadist competition"
