"""A run directory is a self-contained artifact: moved or copied elsewhere, its store
deleted, it forecasts new entities from any working directory (`inference.json`).

Real parts: a synthetic panel with timestamps, ingested, a run trained by `metadist
train` with relative paths, then copied, moved and loaded from other directories.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store, train_tiny

import metadist
from metadist.datasets.synthetic import (
    SYNTHETIC_ENTITY,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_TIME,
    write_synthetic_panel,
)
from metadist.store import SeriesStore
from metadist.store.ingest import ingest
from metadist.train.artifact import (
    INFERENCE_FILE,
    RecordedStore,
    inference_record,
    read_inference,
)
from metadist.train.build import build_task_source

pytestmark = pytest.mark.integration


def train(run_dir: str, store: str, *extra: str) -> None:
    """`metadist train` of a tiny synthetic_maml run, from the working directory."""
    from metadist.cli import main

    code = main(
        [
            "train",
            "experiment=synthetic_maml",
            f"data.store={store}",
            f"run_dir={run_dir}",
            "trainer.meta_steps=2",
            "trainer.meta_batch_size=4",
            "trainer.checkpoint_every=2",
            "trainer.eval_every=0",
            "logging.wandb.mode=disabled",
            "logging.progress=false",
            "--no-eval",
            *extra,
        ]
    )
    assert code == 0


def new_entities(panel: Path, keys: list[str]) -> pa.Table:
    """Entities of the panel under new names: entities no store holds."""
    tables = []
    for number, key in enumerate(keys):
        rows = pq.read_table(panel, filters=[(SYNTHETIC_ENTITY, "=", key)]).sort_by(SYNTHETIC_TIME)
        names = pa.array([f"new-sensor-{number}"] * rows.num_rows)
        tables.append(rows.set_column(rows.column_names.index(SYNTHETIC_ENTITY), "e", names))
    table = pa.concat_tables(tables)
    return table.rename_columns([SYNTHETIC_ENTITY if n == "e" else n for n in table.column_names])


def make_project(root: Path, panel: Path) -> dict:
    """`root/` with `data/store` and `runs/a`, trained with relative paths from `root/`,
    and the forecasts of two new entities computed there."""
    (root / "data").mkdir(parents=True)
    args = {**SYNTHETIC_INGEST_ARGS, "scaling": "global"}  # statistics the record must carry
    ingest(panel, root / "data" / "store", progress=False, **args)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        train("runs/a", "data/store")
        keys = [str(k) for k in SeriesStore.open("data/store").entity_ids[:2]]
        history = new_entities(panel, keys)
        forecasts = metadist.load_run("runs/a").forecast(history, methods=["adapted", "naive"])
    return {"root": root, "history": history, "forecasts": forecasts}


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    panel = tmp_path_factory.mktemp("artifact") / "panel"
    write_synthetic_panel(
        panel, num_entities=24, length_range=(100, 140), seed=5, time_kind="timestamp",
        nan_fraction=0,
    )  # fmt: skip
    return panel


@pytest.fixture(scope="module")
def project(tmp_path_factory, panel):
    return make_project(tmp_path_factory.mktemp("artifact") / "project", panel)


def test_the_run_records_what_inference_needs(project):
    record = read_inference(project["root"] / "runs" / "a")
    assert record is not None
    assert record["store"]["path_from_run_dir"] == "../../data/store"
    assert record["store"]["config_path"] == "data/store"
    assert record["sampler"]["attributes"]["horizon"] == 8
    assert record["store"]["metadata"]["scaling"]["kind"] == "global"
    assert record["eval"]["seasonal_period"]["temperature"] == 24


def test_what_training_records_is_what_load_run_records(project, monkeypatch):
    """The writer training calls (`write_inference(run_dir, config, parts)`) and the
    one `load_run` calls for a run without a record give the same record."""
    monkeypatch.chdir(project["root"])
    run = metadist.load_run("runs/a")
    built = build_task_source(run.config)
    assert inference_record("runs/a", run.config, built) == read_inference("runs/a")
    fields = ("store", "store_identity", "sampler", "input_shape", "output_shape")
    parts = SimpleNamespace(**{name: getattr(built, name) for name in fields})  # RunParts'
    assert inference_record("runs/a", run.config, parts) == read_inference("runs/a")


def test_a_copied_run_reads_the_store_copied_beside_it(project, tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(project["root"], copy)
    monkeypatch.chdir(tmp_path)  # data/store from here is nothing
    run = metadist.load_run(copy / "runs" / "a")
    assert isinstance(run.source.store, SeriesStore)
    shown = repr(run)  # one line, not the network and every setting
    assert shown.startswith(f"Run({str(copy / 'runs' / 'a')!r}, forecast: maml on ")
    assert "\n" not in shown and "store" in shown
    assert run.source.store.path.resolve() == (copy / "data" / "store").resolve()
    table = run.forecast(project["history"], methods=["adapted", "naive"])
    assert table.equals(project["forecasts"])
    # through a link to the run directory: the store beside where the link points
    (tmp_path / "link").symlink_to(copy / "runs" / "a")
    linked = metadist.load_run(tmp_path / "link")
    assert linked.source.store.path.resolve() == (copy / "data" / "store").resolve()


def test_a_moved_run_forecasts_without_its_store(panel, tmp_path, monkeypatch):
    project = make_project(tmp_path / "project", panel)
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(project["root"] / "runs" / "a", moved)
    shutil.rmtree(project["root"])  # the store is gone
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    run = metadist.load_run(moved)
    assert isinstance(run.source.store, RecordedStore) and run.kind == "forecast"
    from metadist.eval import evaluate_run  # needs the store: says where it looked

    with pytest.raises(FileNotFoundError, match=r"its store is not where its inference.json "
                       r"records it, and data.store: no series store at 'data/store' .*--store PATH"):  # fmt: skip
        evaluate_run(moved)
    assert run.config.data.store == "data/store"
    table = run.forecast(project["history"], methods=["adapted", "naive"])
    assert table.equals(project["forecasts"])
    assert table.column(SYNTHETIC_TIME).type == pa.timestamp("ns")  # as the history's
    last = project["history"].column(SYNTHETIC_TIME)[-1].value  # of new-sensor-1
    mine = table.filter(pc.equal(table.column(SYNTHETIC_ENTITY), "new-sensor-1"))
    hours = mine.column(SYNTHETIC_TIME).cast(pa.int64()).to_pylist()[::2]  # 2 methods
    assert hours == [last + step * 3_600 * 10**9 for step in range(1, 9)]

    history = work / "new.parquet"
    pq.write_table(project["history"], history)
    out = work / "forecasts.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "forecast", str(moved), str(history)]
        + ["--out", str(out), "--methods", "adapted,naive"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
    )
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).equals(project["forecasts"])


def test_a_store_replaced_since_the_training_is_noted(panel, tmp_path, monkeypatch, capsys):
    """A store ingested again at the run's store path (other data): the run forecasts
    from its record, and says why (it did so silently)."""
    project = make_project(tmp_path / "project", panel)
    other = tmp_path / "other_panel"
    write_synthetic_panel(other, num_entities=20, length_range=(100, 140), seed=9,
                          time_kind="timestamp", nan_fraction=0)  # fmt: skip
    args = {**SYNTHETIC_INGEST_ARGS, "scaling": "global"}
    ingest(other, project["root"] / "data" / "store", progress=False, **args)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    run = metadist.load_run(project["root"] / "runs" / "a")
    assert isinstance(run.source.store, RecordedStore)
    err = capsys.readouterr().err
    assert f"note: the store at {project['root'] / 'data' / 'store'} is not the one" in err


def test_an_ensemble_of_moved_runs_forecasts_without_their_store(panel, tmp_path, monkeypatch):
    """Both runs moved, their store gone: the members are checked against each other's
    records (the member was refused as trained on "another store", the run directory)."""
    project = make_project(tmp_path / "project", panel)
    with monkeypatch.context() as patch:
        patch.chdir(project["root"])
        train("runs/b", "data/store", "trainer.seed=1")
        together = metadist.load_run("runs/a", ensemble=["runs/b"])
        expected = together.forecast(project["history"], methods=["adapted"])
    moved = tmp_path / "elsewhere"
    shutil.move(project["root"] / "runs", moved)
    shutil.rmtree(project["root"])  # the store is gone
    run = metadist.load_run(moved / "a", ensemble=[moved / "b"])
    assert isinstance(run.source.store, RecordedStore)
    assert run.forecast(project["history"], methods=["adapted"]).equals(expected)


def test_a_run_without_store_or_record_says_so(project, tmp_path, monkeypatch):
    copy = tmp_path / "run"
    shutil.copytree(project["root"] / "runs" / "a", copy)
    (copy / INFERENCE_FILE).unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"has no {INFERENCE_FILE} .*pass store=PATH"):
        metadist.load_run(copy)
    run = metadist.load_run(copy, store=project["root"] / "data" / "store")
    assert run.forecast(project["history"], methods=["adapted", "naive"]).equals(
        project["forecasts"]
    )
    assert read_inference(copy) is not None  # gained on first use with its store
    record = json.loads((copy / INFERENCE_FILE).read_text())
    record["format_version"] = 99
    (copy / INFERENCE_FILE).write_text(json.dumps(record))
    with pytest.raises(FileNotFoundError, match="format version 99"):
        metadist.load_run(copy)


def test_a_moved_run_without_record_is_not_told_to_build_a_store(project, tmp_path, monkeypatch):
    """Its store was built: the remedy is to name where it is, not how to build one."""
    copy = tmp_path / "run"
    shutil.copytree(project["root"] / "runs" / "a", copy)
    (copy / INFERENCE_FILE).unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as refused:
        metadist.load_run(copy)
    assert str(refused.value) == (
        f"data.store: no series store at 'data/store'; run_dir {copy} reads the store its "
        f"config names (relative paths from where it was trained) and has no {INFERENCE_FILE} "
        "(a record of it): pass store=PATH (metadist forecast --store PATH) if it is elsewhere"
    )
    from metadist.eval import evaluate_run

    with pytest.raises(FileNotFoundError) as refused:
        evaluate_run(copy)
    assert str(refused.value) == (
        f"run_dir {copy}: its store is not found: data.store: no series store at 'data/store' "
        "(from the working directory); pass --store PATH (store=PATH) where it is now"
    )


def test_a_run_moved_away_from_its_store_loads_and_evaluates_again_and_again(
    panel, tmp_path, monkeypatch
):
    """The run moves, its store stays where it was: every load from another directory
    finds the store (at the recorded absolute path), loading leaves the run's record as
    it was, and `metadist eval` finds the store the same way or takes it named."""
    project = make_project(tmp_path / "project", panel)
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(project["root"] / "runs" / "a", moved)
    record = (moved / INFERENCE_FILE).read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # data/store from here is nothing
    store = (project["root"] / "data" / "store").resolve()
    for _ in range(2):
        run = metadist.load_run(moved)
        assert isinstance(run.source.store, SeriesStore)
        assert run.source.store.path.resolve() == store
        table = run.forecast(project["history"], methods=["adapted", "naive"])
        assert table.equals(project["forecasts"])
        assert (moved / INFERENCE_FILE).read_bytes() == record  # loading changes nothing

    quick = ["eval.scratch_steps=0", "eval.max_tasks=2", "eval.batch_size=2"]
    from metadist.cli import main

    assert main(["eval", f"run_dir={moved}", *quick, "--no-shared-cache"]) == 0
    assert (moved / "eval" / "metrics.json").is_file()
    assert main(["eval", f"run_dir={moved}", *quick, f"--store={store}"]) == 0
    (moved / INFERENCE_FILE).unlink()  # no record: the config's data.store, from here
    assert main(["eval", f"run_dir={moved}", *quick]) == 1
    assert main(["eval", f"run_dir={moved}", *quick, f"--store={store}"]) == 0


def test_a_classifier_without_its_store_says_it_classifies(tmp_path, monkeypatch):
    """Its repr said "forecasts from its record" of a run that cannot forecast."""
    store = tiny_store(tmp_path, num_entities=40, seed=4)
    train_tiny(
        store, tmp_path / "run", "experiment=synthetic_protonet", "sampler.options.num_ways=2",
        "data.split_by=unit", "sampler.options.lookback=16", "sampler.options.num_query=1",
    )  # fmt: skip
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "run", moved)
    shutil.rmtree(tmp_path / "store")
    monkeypatch.chdir(tmp_path)
    run = metadist.load_run(moved)
    assert run.kind == "classification"
    assert repr(run).endswith(", store gone: classifies from its record)")
