"""Issue 39, the failures that had no test of their own through the command a user runs:
`metadist forecast` of a received run whose config lists `imports` (the issue's case; the
`metadist eval` one is in test_train_loop.py), `metadist forecast` of a history holding
1e300, `metadist eval` on a store whose `entity_stats.npz` is truncated, and
`benchmarks/fewshot.py` stopped by SIGTERM while a training runs.

Real processes on real files, each with a timeout."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _task_stores import build_encoded_store

from metadist.datasets.synthetic import (
    SYNTHETIC_ENTITY,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_TIME,
    write_synthetic_panel,
)
from metadist.launch.children import alive, descendants
from metadist.store.ingest import ingest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
# a module beside a received run: importing it leaves a file behind
MODULE = "received_by_mail"
MODULE_CODE = "import pathlib\npathlib.Path(__file__).with_name('module_ran').write_text('yes')\n"


def _metadist(*args: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line_error(done: subprocess.CompletedProcess, *wanted: str) -> str:
    """The one error line of a refused command (notes aside), holding every `wanted`."""
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    for text in wanted:
        assert text in lines[0], lines[0]
    return lines[0]


def _tiny(store: Path, run_dir: Path) -> list[str]:
    """The overrides of a tiny synthetic_maml training of `store` into `run_dir`."""
    return [
        "experiment=synthetic_maml",
        f"data.store={store}",
        f"run_dir={run_dir}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=2",
        "trainer.eval_every=0",
        "trainer.num_threads=1",
        "model.options.hidden_sizes=[8]",
        "logging.progress=false",
    ]


def _train(tmp: Path, store: Path, name: str, *extra: str) -> Path:
    run_dir = tmp / name
    done = _metadist("train", "--no-eval", *_tiny(store, run_dir), *extra, cwd=tmp, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def received(tmp_path_factory):
    """A run trained with `imports=[MODULE]` (the module beside it), its store and one
    entity's history."""
    tmp = tmp_path_factory.mktemp("received")
    panel = tmp / "panel"
    write_synthetic_panel(panel, num_entities=12, length_range=(80, 120), seed=1, nan_fraction=0)
    store = tmp / "store"
    ingest(panel, store, progress=False, **SYNTHETIC_INGEST_ARGS)
    (tmp / f"{MODULE}.py").write_text(MODULE_CODE)
    run_dir = _train(tmp, store, "run", f"imports=[{MODULE}]")
    (tmp / "module_ran").unlink()  # the training imported it: its owner's own config
    table = pq.read_table(panel)
    entity = table.column(SYNTHETIC_ENTITY)[0].as_py()
    history = pq.read_table(panel, filters=[(SYNTHETIC_ENTITY, "=", entity)])
    pq.write_table(history.sort_by(SYNTHETIC_TIME), tmp / "history.parquet")
    return {"tmp": tmp, "run": run_dir, "store": store, "history": tmp / "history.parquet"}


def test_metadist_forecast_of_a_received_run_runs_none_of_its_imports(received):
    tmp, out = received["tmp"], received["tmp"] / "forecast.parquet"
    command = ["forecast", str(received["run"]), str(received["history"]), "--out", str(out)]
    refused = _metadist(*command, cwd=tmp)
    _one_line_error(refused, f"--allow-import {MODULE}", f"'{MODULE}'")
    assert not (tmp / "module_ran").exists() and not out.exists()
    allowed = _metadist(*command, "--allow-import", MODULE, cwd=tmp)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert (tmp / "module_ran").read_text() == "yes" and out.is_file()
    (tmp / "module_ran").unlink()
    out.unlink()


def test_metadist_forecast_of_a_value_a_store_cannot_hold_is_one_line(received):
    value = 1e300  # exited 0 with NaN forecasts (ingest refuses it)
    tmp, out = received["tmp"], received["tmp"] / "huge.parquet"
    history = pq.read_table(received["history"])
    column = "load"
    values = history.column(column).to_numpy().copy()
    values[5] = value
    at = history.column_names.index(column)
    pq.write_table(history.set_column(at, column, pa.array(values)), tmp / "huge_history.parquet")
    done = _metadist(
        "forecast",
        str(received["run"]),
        str(tmp / "huge_history.parquet"),
        "--out",
        str(out),
        "--allow-import",
        MODULE,
        cwd=tmp,
    )
    _one_line_error(done, "metadist forecast: error:", f"has {value:g} in column '{column}'")
    assert not out.exists()  # no NaN forecasts written


def test_metadist_forecast_refuses_an_entity_of_one_row_and_an_out_directory_first(received):
    """One row gives no time step, so no times for its forecasts: refused with one line
    naming the entity (it was an AssertionError after every entity had been adapted);
    --out naming a directory is one line too (it was a traceback after the work)."""
    tmp, out = received["tmp"], received["tmp"] / "one_row.parquet"
    history = pq.read_table(received["history"])
    entity = history.column_names.index(SYNTHETIC_ENTITY)
    lonely = history.slice(0, 1).set_column(entity, SYNTHETIC_ENTITY, pa.array(["lonely"]))
    pq.write_table(pa.concat_tables([history, lonely]), tmp / "one_row_history.parquet")
    done = _metadist(
        "forecast", str(received["run"]), str(tmp / "one_row_history.parquet"),
        "--out", str(out), "--allow-import", MODULE, cwd=tmp,
    )  # fmt: skip
    _one_line_error(done, "entity 'lonely' has one row", "at least two rows")
    assert not out.exists()
    done = _metadist(
        "forecast", str(received["run"]), str(received["history"]),
        "--out", str(tmp), "--allow-import", MODULE, cwd=tmp,
    )  # fmt: skip
    _one_line_error(done, f"--out {tmp} is a directory")


@pytest.mark.slow  # a training of its own; the store's own check is fast in test_store_hardening
def test_metadist_eval_on_a_truncated_entity_stats_is_one_line(received, tmp_path):
    store = Path(shutil.copytree(received["store"], tmp_path / "store"))
    run_dir = _train(tmp_path, store, "run")
    stats = store / "entity_stats.npz"
    stats.write_bytes(stats.read_bytes()[: stats.stat().st_size // 2])
    done = _metadist("eval", f"run_dir={run_dir}", "eval.max_tasks=4", cwd=tmp_path)
    # refused by the run's record of its store (the file's checksum), before any read
    _one_line_error(done, "metadist eval: error:", "entity_stats.npz")
    assert "BadZipFile" not in done.stderr


# ---------------------------------------------- an orchestrator owns its trainings


@pytest.mark.slow  # ~16 s: a benchmark script's trainings
@pytest.mark.timeout(240)
def test_sigterm_to_benchmarks_fewshot_stops_the_training_it_started(tmp_path):
    out = tmp_path / "out"
    (out / "data" / "toy").mkdir(parents=True)
    build_encoded_store(out / "data" / "toy", [60] * 40)  # 4 classes of 10 cases
    command = [
        *(sys.executable, str(ROOT / "benchmarks" / "fewshot.py"), "--sets", "toy"),
        *("--shots", "1", "--learners", "protonet", "--out", str(out)),
        "trainer.meta_steps=1000000",
    ]
    bench = subprocess.Popen(
        command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not list(out.glob("runs/*/metrics.jsonl")):
            assert bench.poll() is None, bench.communicate()[1][-3000:]
            time.sleep(0.2)  # the training has written its first record
        assert list(out.glob("runs/*/metrics.jsonl")), "the training never started"
        seen |= set(descendants(bench.pid))
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=120)
    finally:
        leftover = descendants(bench.pid)
        if bench.poll() is None:
            bench.kill()
        for pid in leftover:  # never leave a training behind, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert seen, "no training process was seen"
    assert bench.returncode == 128 + signal.SIGTERM, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1] == "benchmarks/fewshot.py: stopped by SIGTERM; 1 process it started stopped"
    assert "Traceback" not in err
    for pid in seen:
        assert not alive(pid), f"process {pid} outlived benchmarks/fewshot.py"
    assert not (out / "fewshot.md").exists()


def test_a_training_whose_evaluation_fails_exits_non_zero_and_says_how_to_evaluate(
    received, tmp_path
):
    """`metadist train` evaluates the run it finished; where that evaluation fails (here
    eval.split=val of a partition without meta-val units, found only when the tasks are
    built), the command exits 1 with one error line that keeps the training and names
    `metadist eval`, rather than a note and exit 0."""
    store = received["run"].parent / "store"
    run_dir = tmp_path / "run"
    done = _metadist(
        "train", *_tiny(store, run_dir), "data.fractions=[0.9,0.0,0.1]", "eval.split=val",
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, done.stderr[-3000:]  # the training's own lines before it
    for text in ("the training finished", "eval.split", f"metadist eval run_dir={run_dir}"):
        assert text in errors[0], errors[0]
    assert (run_dir / "checkpoints").is_dir() and not (run_dir / "eval" / "metrics.json").exists()


def test_a_store_is_never_a_run_directory_nor_replaced_over_a_run(received, tmp_path):
    """`metadist train run_dir=STORE` is refused before anything is written (a later
    ingest into the store would have deleted the run), and an ingest does not replace a
    store directory a run was trained into."""
    store = tmp_path / "store"
    shutil.copytree(received["store"], store)
    before = sorted(p.name for p in store.iterdir())
    done = _metadist(
        "train", "--no-eval", "experiment=synthetic_maml", f"data.store={received['store']}",
        f"run_dir={store}", "trainer.meta_steps=2", "logging.progress=false", cwd=tmp_path,
    )  # fmt: skip
    _one_line_error(done, f"run_dir {store} is a series store")
    assert sorted(p.name for p in store.iterdir()) == before
    import metadist

    with pytest.raises(FileNotFoundError, match=f"run_dir {store} is a series store, not a run"):
        metadist.load_run(store)  # not "no checkpoint yet; train first"
    (store / "checkpoints").mkdir()  # a run trained into it before this check
    with pytest.raises(FileExistsError, match="also holds a training run"):
        ingest(received["tmp"] / "panel", store, progress=False, **SYNTHETIC_INGEST_ARGS)
    assert (store / "checkpoints").is_dir()


def test_an_experiments_seasonal_periods_that_miss_the_stores_strata_stop_before_training(
    received, tmp_path
):
    """synthetic_maml's eval.seasonal_period maps its own sensor types; a store of other
    strata (the README's `metadist train experiment=synthetic_maml data.store=STORE`)
    is told what to set before any training (the evaluation had failed after it)."""
    table = pq.read_table(received["tmp"] / "panel")
    entities = table.column(SYNTHETIC_ENTITY).to_pylist()
    order = {e: i for i, e in enumerate(sorted(set(entities)))}  # alternate by entity
    strata = pa.array(["east" if order[e] % 2 else "west" for e in entities])
    at = table.column_names.index("sensor_type")
    pq.write_table(table.set_column(at, "sensor_type", strata), tmp_path / "regions.parquet")
    store = tmp_path / "store"
    ingest(tmp_path / "regions.parquet", store, progress=False, **SYNTHETIC_INGEST_ARGS)
    run_dir = tmp_path / "run"
    common = ["experiment=synthetic_maml", f"data.store={store}", f"run_dir={run_dir}"]
    done = _metadist("train", *common, "trainer.meta_steps=2", cwd=tmp_path)
    _one_line_error(done, "eval.seasonal_period", "(east, west)", "eval.seasonal_period=M")
    assert not run_dir.exists()  # refused before anything was written
    done = _metadist("train", *common, "eval.labels=[nowhere]", cwd=tmp_path)
    _one_line_error(done, "eval.labels: store", "has no label 'nowhere'")
    assert not run_dir.exists()
    done = _metadist(
        "train", *common, "trainer.meta_steps=2", "trainer.meta_batch_size=2",
        "trainer.eval_every=0", "model.options.hidden_sizes=[8]", "logging.progress=false",
        "eval.seasonal_period=24", "eval.scratch_steps=0", "eval.max_tasks=2", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "eval" / "metrics.json").is_file()


def test_a_run_resumes_from_its_store_at_a_new_path_but_not_from_another_store(received, tmp_path):
    """The store is part of a run by its identity, not its path: a run whose store moved
    (a renamed competition output) resumes from the new path; another store is refused."""
    first = tmp_path / "first_store"
    shutil.copytree(received["store"], first)
    run_dir = _train(tmp_path, first, "run")
    moved = tmp_path / "moved_store"
    first.rename(moved)
    _train(tmp_path, moved, "run", "trainer.meta_steps=4")  # resumed: asserts rc 0
    assert (run_dir / "checkpoints" / "step_00000004.pt").is_file()
    panel = tmp_path / "other_panel"
    write_synthetic_panel(panel, num_entities=12, length_range=(80, 120), seed=2, nan_fraction=0)
    other = tmp_path / "other_store"
    ingest(panel, other, progress=False, **SYNTHETIC_INGEST_ARGS)
    done = _metadist(
        "train", "--no-eval", "experiment=synthetic_maml", f"data.store={other}",
        f"run_dir={run_dir}", "trainer.meta_steps=6", "trainer.meta_batch_size=2",
        "trainer.eval_every=0", "model.options.hidden_sizes=[8]", "logging.progress=false",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "is not the store" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("signum", "times"),
    [
        (signal.SIGTERM, 1),
        # the same path as SIGTERM's (slow: seconds each)
        pytest.param(signal.SIGINT, 1, marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, 2, marks=pytest.mark.slow),
    ],
)
def test_a_stop_during_the_evaluation_after_training_says_the_run_is_kept(tmp_path, signum, times):
    """SIGTERM or Ctrl-C while `metadist train` evaluates the run it finished: exit 143
    or 130 with a line saying the training is kept and how to evaluate it (SIGTERM: it
    died without a word; Ctrl-C: a traceback)."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "metadist.cli", "train", "experiment=sinusoid_maml",
        f"run_dir={run_dir}", "trainer.meta_steps=2", "trainer.eval_every=0",
        "logging.progress=false", "eval.scratch_steps=1000000",  # a long evaluation
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal, also where the tests run in the background (SIGINT
        # ignored there, which the child would inherit)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / "step_00000002.pt").is_file():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.2)
        time.sleep(3)  # into the evaluation
        process.send_signal(signum)
        if times == 2:  # the same Ctrl-C passed on by a parent (or GNU timeout) too
            time.sleep(0.05)
            process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, err[-2000:]
    assert f"{name} stopped the evaluation" in err and f"metadist eval run_dir={run_dir}" in err
    assert "Traceback" not in err, err[-2000:]


def test_a_run_saved_without_a_store_identity_is_its_store_by_path(tmp_path):
    """Runs saved before stores had a recorded identity keep the path check: another
    data.store is refused, the same one (however spelt) resumes."""
    from metadist.train.resume import check_same_store_path

    old = {"config": {"data": {"store": str(tmp_path / "a")}}}
    check_same_store_path(old, str(tmp_path / "x" / ".." / "a"), tmp_path)
    with pytest.raises(ValueError, match="saved before stores had a recorded identity"):
        check_same_store_path(old, str(tmp_path / "b"), tmp_path)
    check_same_store_path({**old, "store_identity": {"num_entities": 1}}, "b", tmp_path)


@pytest.mark.parametrize(
    ("override", "wanted"),
    [
        ("learner.options.inner_lrr=0.1", "learner.options.inner_lrr: unknown option"),
        ("trainer.meta_batch_size=400", "trainer.meta_batch_size=400 over 2 rank(s)"),
    ],
)
def test_a_launch_on_two_ranks_refuses_what_its_ranks_would_in_one_line_first(
    received, tmp_path, override, wanted
):
    """`metadist train --nproc-per-node=2` checks the components' options and the
    loaders at its world size before torchrun starts: one line, no rank's report."""
    run_dir = tmp_path / "run"
    done = _metadist(
        "train", "--nproc-per-node=2", *_tiny(received["store"], run_dir), override, cwd=tmp_path
    )
    line = _one_line_error(done, wanted)
    assert "torchrun" not in done.stderr and "rank" not in line.split(":")[0]
    assert not run_dir.exists()


@pytest.mark.timeout(200)
def test_a_rank_that_fails_speaks_as_the_command_and_torchrun_adds_one_line(received, tmp_path):
    """A damaged store found by the ranks: each rank's line is `metadist train: error:`
    (the ranks said `metadist-train`), then torchrun's one line, without its own error log."""
    damaged = tmp_path / "damaged"
    shutil.copytree(received["store"], damaged)
    with open(damaged / "values.bin", "r+b") as values:
        values.seek(1000)
        byte = values.read(1)
        values.seek(1000)
        values.write(bytes([byte[0] ^ 255]))
    done = _metadist(
        "train", "--nproc-per-node=2", *_tiny(damaged, tmp_path / "run"), cwd=tmp_path, timeout=180
    )
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("note:")]
    assert lines[0].startswith("metadist train: error: store ") and "values.bin" in lines[0]
    assert lines[-1].startswith("torchrun: the process of rank "), done.stderr[-3000:]
    assert len(lines) == 2 and "metadist-train" not in done.stderr, done.stderr[-3000:]


def test_an_evaluation_on_two_ranks_refuses_bad_settings_in_one_line_first(received):
    """`metadist eval --nproc-per-node=2` checks the run, store and settings before
    torchrun starts: one line, no rank's report."""
    tmp = received["tmp"]
    for extra, wanted in (
        (["eval.max_taskz=2"], "eval.max_taskz: unknown field"),
        ([f"--store={tmp / 'nope'}"], "(store=PATH, --store PATH): no series store there"),
    ):
        done = _metadist(
            "eval", "--nproc-per-node=2", f"run_dir={received['run']}", "--allow-import",
            MODULE, *extra, cwd=tmp,
        )  # fmt: skip
        _one_line_error(done, wanted)
        assert "torchrun" not in done.stderr
    (tmp / "module_ran").unlink(missing_ok=True)  # the check imported the allowed module
