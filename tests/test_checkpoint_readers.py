"""A damaged or missing checkpoint met by `metadist eval`, `metadist forecast` or
`metadist.load_run`: the one line (or note) says what that command can do about it, not
what a training would (resume, another run_dir, an eval setting)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store, train_tiny

import metadist
from metadist.cli import main
from metadist.datasets.synthetic import SYNTHETIC_ENTITY
from metadist.train.checkpoint import CheckpointError, latest_checkpoint

pytestmark = pytest.mark.integration
TRAINING_WORDS = ("resum", "run_dir", "afresh", "eval.checkpoint")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of 2 meta-steps with a checkpoint at each and a best one on meta-val, and
    one entity's history to forecast."""
    tmp = tmp_path_factory.mktemp("readers")
    store = tiny_store(tmp, num_entities=20, seed=1)
    run_dir = train_tiny(
        store, tmp / "run", "experiment=synthetic_maml", "trainer.checkpoint_every=1",
        "trainer.eval_every=1",
    )  # fmt: skip
    assert (run_dir / "checkpoints" / "best").is_file()
    panel = pq.read_table(tmp / "panel")
    entity = panel.column(SYNTHETIC_ENTITY)[0]
    pq.write_table(panel.filter(pc.equal(panel[SYNTHETIC_ENTITY], entity)), tmp / "history.pq")
    return {"run": run_dir, "history": tmp / "history.pq"}


def _copy(trained, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(trained["run"], run_dir)
    return run_dir


def _commands(trained, run_dir: Path, tmp_path: Path, capsys) -> dict[str, str]:
    """The stderr of `metadist eval` and `metadist forecast` of `run_dir`."""
    errors = {}
    assert main(["eval", f"run_dir={run_dir}"]) == 1
    errors["eval"] = capsys.readouterr().err
    forecast = ["forecast", str(run_dir), str(trained["history"]), "--out", str(tmp_path / "f")]
    assert main(forecast) == 1
    errors["forecast"] = capsys.readouterr().err
    return errors


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("note: stratum")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.timeout(300)
def test_a_damaged_best_pointer_is_met_with_what_each_command_can_do(trained, tmp_path, capsys):
    run_dir = _copy(trained, tmp_path)
    (run_dir / "checkpoints" / "best").write_text("not json")
    errors = _commands(trained, run_dir, tmp_path, capsys)
    assert "remove it to evaluate the latest checkpoint instead" in _one_line(errors["eval"])
    assert "remove it to use the latest checkpoint instead" in _one_line(errors["forecast"])
    with pytest.raises(CheckpointError, match="remove it to use the latest checkpoint") as caught:
        metadist.load_run(run_dir)
    for message in (errors["eval"], errors["forecast"], str(caught.value)):
        assert not any(word in message for word in TRAINING_WORDS), message


@pytest.mark.timeout(300)
def test_a_damaged_latest_pointer_is_met_with_what_each_command_can_do(trained, tmp_path, capsys):
    run_dir = _copy(trained, tmp_path)
    (run_dir / "checkpoints" / "best").unlink()
    (run_dir / "checkpoints" / "latest").write_text("[]")
    errors = _commands(trained, run_dir, tmp_path, capsys)
    assert "remove it to evaluate the newest checkpoint that verifies" in _one_line(errors["eval"])
    assert "remove it to use the newest checkpoint that verifies" in _one_line(errors["forecast"])
    for message in errors.values():
        assert not any(word in message for word in TRAINING_WORDS), message
    # a training of the same run_dir still reads it as a training does
    with pytest.raises(CheckpointError, match="to resume from the newest checkpoint"):
        latest_checkpoint(run_dir)


@pytest.mark.timeout(300)
def test_no_checkpoint_that_verifies_says_the_run_is_lost_to_the_command(trained, tmp_path, capsys):
    run_dir = _copy(trained, tmp_path)
    (run_dir / "checkpoints" / "best").unlink()
    (run_dir / "checkpoints" / "latest").unlink()
    for path in (run_dir / "checkpoints").glob("step_*.pt"):
        path.write_bytes(path.read_bytes()[:1000])
    errors = _commands(trained, run_dir, tmp_path, capsys)
    assert "no checkpoint left to evaluate: restore them or train it again" in _one_line(
        errors["eval"]
    )
    assert "no checkpoint left to use: restore them or train it again" in _one_line(
        errors["forecast"]
    )
    for message in errors.values():
        assert not any(word in message for word in TRAINING_WORDS), message


@pytest.mark.timeout(300)
def test_a_missing_latest_pointer_notes_the_checkpoint_used_not_resumed(trained, tmp_path, capsys):
    run_dir = _copy(trained, tmp_path)
    (run_dir / "checkpoints" / "best").unlink()
    (run_dir / "checkpoints" / "latest").unlink()
    metadist.load_run(run_dir)
    err = capsys.readouterr().err
    newest = run_dir / "checkpoints" / "step_00000002.pt"
    assert f"latest is missing; using {newest}, the newest checkpoint that verifies" in err
    assert "resuming" not in err


@pytest.mark.timeout(300)
def test_a_checkpoint_of_another_run_is_met_with_what_each_command_can_do(
    trained, tmp_path, capsys
):
    run_dir = _copy(trained, tmp_path)
    (run_dir / "checkpoints" / "run.json").write_text('{"run_id": "another"}\n')
    errors = _commands(trained, run_dir, tmp_path, capsys)
    assert "move it away to evaluate this run's own checkpoints" in _one_line(errors["eval"])
    assert "move it away to use this run's own checkpoints" in _one_line(errors["forecast"])
    for message in errors.values():
        assert not any(word in message for word in TRAINING_WORDS), message


def test_a_directory_holding_a_run_points_each_command_at_it(trained, tmp_path, capsys):
    run_dir = _copy(trained, tmp_path)
    with pytest.raises(FileNotFoundError, match="use that instead") as caught:
        metadist.load_run(tmp_path)
    assert f"run_dir={run_dir}" in str(caught.value)
    assert main(["eval", f"run_dir={tmp_path}"]) == 1
    assert "evaluate that instead" in _one_line(capsys.readouterr().err)
