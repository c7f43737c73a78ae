"""`metadist competition`: an evaluation done again on the same inputs is read back, not
redone; anything it reads that changed (a checkpoint, the settings, the holdout, the
store) evaluates again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from competition_data import competition_runner, write_quarterly

from metadist.commands.competition.reuse import (
    INPUTS_FILE,
    REPORTS,
    evaluated_before,
    forget_evaluations,
    inputs_digest,
    record_inputs,
)

ROOT = Path(__file__).resolve().parents[1]


def _run_dir(path: Path) -> Path:
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / "step_00000004.pt").write_bytes(b"weights")
    (path / "best.json").write_text('{"step": 4}')
    (path / "config.yaml").write_text("trainer: {}\n")
    return path


def test_the_digest_follows_every_input(tmp_path):
    runs = [_run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")]
    holdout, store = tmp_path / "test.parquet", tmp_path / "store"
    holdout.write_bytes(b"holdout")
    store.mkdir()
    (store / "values.bin").write_bytes(b"\0" * 10)
    first = inputs_digest(runs, [store, holdout], ["eval.split=all"])
    assert inputs_digest(runs, [store, holdout], ["eval.split=all"]) == first
    changes = [
        lambda: (runs[1] / "checkpoints" / "step_00000004.pt").write_bytes(b"retrained"),
        lambda: (runs[0] / "best.json").write_text('{"step": 2}'),
        lambda: holdout.write_bytes(b"another holdout"),
        lambda: (store / "values.bin").write_bytes(b"\1" * 10),
        lambda: (runs[0] / "periods.json").write_text("{}"),
    ]
    seen = {first}
    for change in changes:
        change()
        now = inputs_digest(runs, [store, holdout], ["eval.split=all"])
        assert now not in seen
        seen.add(now)
    assert inputs_digest(runs, [store, holdout], ["eval.split=test"]) not in seen
    assert inputs_digest(runs[:1], [store, holdout], ["eval.split=all"]) not in seen


def _reports(run: Path, text: str = "") -> None:
    (run / "eval").mkdir(exist_ok=True)
    for name in REPORTS:
        (run / "eval" / name).write_text(text)


def test_only_a_complete_evaluation_of_the_same_inputs_is_read_back(tmp_path):
    run = _run_dir(tmp_path / "run")
    assert not evaluated_before(run, "d1")  # never evaluated
    _reports(run)
    record_inputs(run, "d1", lambda: "d1")
    assert evaluated_before(run, "d1")
    assert not evaluated_before(run, "d2")  # other inputs: the record goes
    assert not (run / "eval" / INPUTS_FILE).exists()
    assert not evaluated_before(run, "d1")
    record_inputs(run, "d1", lambda: "d1")
    (run / "eval" / "forecasts.parquet").unlink()  # an evaluation that did not finish
    assert not evaluated_before(run, "d1")


def test_an_evaluation_that_wrote_no_report_is_not_recorded(tmp_path):
    run = _run_dir(tmp_path / "run")
    _reports(run)
    (run / "eval" / "tasks.parquet").unlink()
    record_inputs(run, "d1", lambda: "d1")
    assert not (run / "eval" / INPUTS_FILE).exists()


def test_a_report_another_command_wrote_since_is_evaluated_again(tmp_path):
    # e.g. `metadist eval --plain` moved the competition's evaluation aside and wrote its own
    run = _run_dir(tmp_path / "run")
    _reports(run, "the competition's")
    record_inputs(run, "d1", lambda: "d1")
    _reports(run, "a plain evaluation's")
    assert not evaluated_before(run, "d1")


def test_inputs_that_moved_during_the_evaluation_are_not_recorded(tmp_path):
    run = _run_dir(tmp_path / "run")
    _reports(run)
    record_inputs(run, "d1", lambda: "d2")  # a checkpoint written meanwhile
    assert not (run / "eval" / INPUTS_FILE).exists()


def test_large_files_and_links_count_by_what_no_copy_keeps(tmp_path):
    runs = [_run_dir(tmp_path / "a")]
    holdout = tmp_path / "test.parquet"
    holdout.write_bytes(b"a" * 100_000)
    first = inputs_digest(runs, [holdout], [])
    status = holdout.stat()
    holdout.write_bytes(b"b" * 100_000)  # the same size, its time of writing put back
    os.utime(holdout, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert inputs_digest(runs, [holdout], []) != first
    pointer = runs[0] / "checkpoints" / "best"
    pointer.symlink_to("step_00000009.pt")  # dangling: no such checkpoint
    dangling = inputs_digest(runs, [holdout], [])
    pointer.unlink()
    assert inputs_digest(runs, [holdout], []) != dangling
    # a file an override names counts too
    named = tmp_path / "other.parquet"
    named.write_bytes(b"x")
    overrides = [f'eval.holdout={{"path": "{named}"}}']
    before = inputs_digest(runs, [holdout], overrides)
    named.write_bytes(b"y")
    assert inputs_digest(runs, [holdout], overrides) != before


def test_evaluate_again_forgets_every_record(tmp_path):
    run = _run_dir(tmp_path / "out" / "h4" / "L8-smape-s1")
    _reports(run)
    record_inputs(run, "d1", lambda: "d1")
    forget_evaluations(tmp_path / "out")
    assert not evaluated_before(run, "d1")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_validation_run_made_again_reads_its_evaluations_back(tmp_path):
    data = write_quarterly(tmp_path / "data", 6, 32, "smape")
    out = tmp_path / "val"
    run = competition_runner(
        [str(data), "--validation", "--experiment", "competition_cpu", "--ets", "no"]
        + ["--jobs", "1", "--lookbacks", "2", "3", "--loss-candidates", "smape"]
        + ["--out", str(out), "trainer.meta_steps=4", "trainer.meta_batch_size=4"]
        + ["trainer.eval_every=2", "model.options.hidden_sizes=[8]"],
        timeout=120,
    )

    first = run()
    evaluations = first.count("== evaluate H=4 (") // 2  # announced, then timed
    assert evaluations == 2 and "read back" not in first  # the pair, and 2H alone
    metrics = out / "h4" / "L12-smape-s1" / "eval" / "metrics.json"
    written, choices = metrics.stat().st_mtime_ns, (out / "choices.json").read_text()
    again = run()
    assert again.count("   read back: ") == evaluations
    assert metrics.stat().st_mtime_ns == written  # not evaluated again
    assert (out / "choices.json").read_text() == choices
    # a member whose best checkpoint changed (as a training again would) is evaluated again
    checkpoints = out / "h4" / "L8-smape-s1" / "checkpoints"
    best = json.loads((checkpoints / "best").read_text())
    state = torch.load(checkpoints / best["checkpoint"], map_location="cpu", weights_only=False)
    torch.save({**state, "trained": "again"}, checkpoints / best["checkpoint"])
    written_now = (checkpoints / best["checkpoint"]).read_bytes()
    for pointer in ("best", "latest"):
        record = json.loads((checkpoints / pointer).read_text())
        if record["checkpoint"] == best["checkpoint"]:
            record["num_bytes"] = len(written_now)
            record["sha256"] = hashlib.sha256(written_now).hexdigest()
            (checkpoints / pointer).write_text(json.dumps(record, indent=1) + "\n")
    third = run()
    assert third.count("   read back: ") == evaluations - 2  # both candidates hold the 2H run
    assert metrics.stat().st_mtime_ns > written
    assert run("--evaluate-again").count("   read back: ") == 0
