"""The training loop in one process: exact resume, NaN stop, metrics and the run id."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from metadist.train import (
    NonFiniteLossError,
    latest_checkpoint_state,
    load_config,
    train,
)
from metadist.train import logging as run_logging
from metadist.train.logging import read_metrics

TINY = [
    "experiment=sinusoid_maml",
    "sampler.options.num_tasks=40",  # 32 meta-train tasks: 8 batches per epoch
    "model.options.hidden_sizes=[8]",
    "trainer.meta_batch_size=4",
    "trainer.eval_batches=2",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
    "logging.log_every=2",
]


def tiny_config(run_dir, *overrides: str):
    return load_config([*TINY, f"run_dir={run_dir}", *overrides], world_size=1)


def params(learner) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in learner.state_dict().items()}


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


def test_stop_and_restart_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    # 14 steps cross an epoch boundary (8 batches per epoch) and evaluate at 6 and 12.
    schedule = ["trainer.meta_steps=14", "trainer.eval_every=6", "trainer.checkpoint_every=4"]
    reference = train(tiny_config(tmp_path / "straight", *schedule))
    assert reference.step == 14 and reference.stopped_by is None

    def sigterm_at_six(step, values):
        assert set(values) >= {"loss", "query_loss_after"}
        if step == 6:
            os.kill(os.getpid(), signal.SIGTERM)

    config = tiny_config(tmp_path / "stopped", *schedule)
    first = train(config, on_eval=sigterm_at_six)
    # The signal lands during step 6's evaluation; the ranks agree on it after step 7.
    assert first.stopped_by == "SIGTERM" and first.step == 7
    assert latest_checkpoint_state(config.resolved_run_dir)["step"] == 7
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handler restored
    second = train(config)
    assert second.step == 14 and second.stopped_by is None
    assert_bit_identical(params(second.learner), params(reference.learner))
    assert second.loss == reference.loss

    steps = [(r["split"], r["step"]) for r in read_metrics(config.resolved_run_dir)]
    assert steps == [(r["split"], r["step"]) for r in read_metrics(reference.run_dir)]
    assert len(steps) == len(set(steps))


def test_restarting_a_finished_run_changes_nothing(tmp_path):
    config = tiny_config(tmp_path / "run", "trainer.meta_steps=3")
    done = params(train(config).learner)
    again = train(config)
    assert again.step == 3
    assert_bit_identical(params(again.learner), done)


def test_a_longer_schedule_continues_the_same_run(tmp_path):
    short = train(tiny_config(tmp_path / "a", "trainer.meta_steps=5"))
    longer = train(tiny_config(tmp_path / "a", "trainer.meta_steps=9"))
    straight = train(tiny_config(tmp_path / "b", "trainer.meta_steps=9"))
    assert short.step == 5 and longer.step == 9
    assert_bit_identical(params(longer.learner), params(straight.learner))


def test_resuming_with_another_model_is_refused(tmp_path):
    train(tiny_config(tmp_path / "run", "trainer.meta_steps=2"))
    with pytest.raises(ValueError) as refused:
        train(
            tiny_config(tmp_path / "run", "trainer.meta_steps=4", "model.options.hidden_sizes=[4]")
        )
    message = str(refused.value)
    assert "holds a run with model.options.hidden_sizes=[" in message
    assert "but this command has model.options.hidden_sizes=[4]" in message
    new_dir = message.rsplit("start a new run with run_dir=", 1)[1]
    assert new_dir == f"{tmp_path / 'run'}.hidden_sizes-4"
    # the command it prints starts a new run
    again = train(
        tiny_config(Path(new_dir), "trainer.meta_steps=4", "model.options.hidden_sizes=[4]")
    )
    assert again.step == 4


def test_a_run_resumes_when_a_new_option_is_null(tmp_path):
    # A run saved before an upgrade added a sampler option (null by default) resumes; a
    # value that is not the default is still refused.
    from metadist.train.loop import check_same_run

    saved = tiny_config(tmp_path / "run").to_dict()
    upgraded = copy.deepcopy(saved)
    upgraded["sampler"]["options"]["new_option"] = None
    check_same_run(saved, upgraded, tmp_path / "run")
    upgraded["sampler"]["options"]["new_option"] = 3
    with pytest.raises(
        ValueError,
        match=r"holds a run with sampler.options.new_option=\(not set\), but this command has sampler.options.new_option=3",
    ):
        check_same_run(saved, upgraded, tmp_path / "run")


def test_a_run_saved_before_head_init_resumes_with_the_default_head(tmp_path):
    # The forecaster's head_init came after runs were saved without it: such a run had
    # PyTorch's head ("default"), so it resumes with that value and no other.
    from metadist.train.loop import check_same_run

    saved = tiny_config(tmp_path / "run").to_dict()
    saved["model"]["options"].pop("head_init", None)
    upgraded = copy.deepcopy(saved)
    upgraded["model"]["options"]["head_init"] = "default"
    check_same_run(saved, upgraded, tmp_path / "run")
    assert "head_init" not in saved["model"]["options"]  # the saved settings unchanged
    upgraded["model"]["options"]["head_init"] = "zero"
    with pytest.raises(
        ValueError,
        match=r"holds a run with model.options.head_init='default', but this command has "
        r"model.options.head_init='zero'",
    ):
        check_same_run(saved, upgraded, tmp_path / "run")


def test_nan_meta_loss_stops_with_last_good_checkpoint_intact(tmp_path):
    config = tiny_config(
        tmp_path / "run",
        "trainer.meta_steps=30",
        "trainer.checkpoint_every=2",
        "optimizer=sgd",
        "optimizer.lr=1.0",
        "optimizer.momentum=0.0",
    )
    with pytest.raises(NonFiniteLossError, match=r"not finite at step (\d+)") as caught:
        train(config)
    failed_step = int(caught.value.args[0].split("at step ")[1].split()[0])
    state = latest_checkpoint_state(config.resolved_run_dir)
    assert 0 < state["step"] < failed_step
    assert f"step_{state['step']:08d}.pt" in str(caught.value)
    assert all(torch.isfinite(t).all() for t in state["learner"].values())
    records = read_metrics(config.resolved_run_dir)
    assert all(r["step"] < failed_step for r in records)


def test_metrics_config_and_run_id_are_kept_with_the_run(tmp_path, monkeypatch):
    started = []

    class Recorder:
        def __init__(self, **kwargs):
            started.append(kwargs)
            self.logged = []

        def log(self, values, step):
            self.logged.append((step, values))

        def finish(self):
            pass

    # The wandb run is replaced by a recorder so the test never opens a connection; what
    # is checked is what metadist asks wandb for.
    monkeypatch.setattr(run_logging, "start_wandb", lambda config, run_dir, **kw: Recorder(**kw))
    monkeypatch.delenv("WANDB_MODE")  # the suite's default (disabled) would win over offline
    offline = ["logging.wandb.mode=offline", "trainer.eval_every=2"]
    config = tiny_config(tmp_path / "run", "trainer.meta_steps=4", *offline)
    train(config)
    run_id = latest_checkpoint_state(config.resolved_run_dir)["run_id"]
    assert len(run_id) >= 8 and started[0]["run_id"] == run_id
    train(tiny_config(tmp_path / "run", "trainer.meta_steps=6", *offline))
    assert started[1]["run_id"] == run_id  # the resumed run continues the same wandb run
    assert latest_checkpoint_state(config.resolved_run_dir)["run_id"] == run_id

    records = read_metrics(config.resolved_run_dir)
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == [2, 4, 6]
    assert all(r["tasks_per_s"] > 0 and r["loss"] > 0 for r in train_records)
    assert [r["step"] for r in records if r["split"] == "val"] == [2, 4, 6]
    assert (config.resolved_run_dir / "config.yaml").read_text().count("sinusoid") >= 1


def test_sigusr1_before_preemption_checkpoints_and_stops(tmp_path):
    def usr1_at_two(step, values):
        if step == 2:
            os.kill(os.getpid(), signal.SIGUSR1)

    config = tiny_config(tmp_path / "run", "trainer.meta_steps=50", "trainer.eval_every=2")
    result = train(config, on_eval=usr1_at_two)
    assert result.stopped_by == "SIGUSR1" and result.step == 3
    assert latest_checkpoint_state(config.resolved_run_dir)["step"] == 3
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_ctrl_c_checkpoints_and_stops_like_sigterm(tmp_path):
    def sigint_at_two(step, values):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    config = tiny_config(tmp_path / "run", "trainer.meta_steps=50", "trainer.eval_every=2")
    before = signal.getsignal(signal.SIGINT)  # ignored where the tests run in the background
    result = train(config, on_eval=sigint_at_two)
    assert result.stopped_by == "SIGINT" and result.step == 3
    assert result.checkpoint is not None and result.checkpoint.exists()
    assert latest_checkpoint_state(config.resolved_run_dir)["step"] == 3
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is put back


USER_SAMPLER = """
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.tasks import TaskSampler, register_task_sampler, task_uniform


@register_task_sampler("user_lines")
class UserLines(TaskSampler):
    needs_store = False

    def __init__(self, *, num_tasks=40, num_points=5):
        self.num_tasks, self.num_points = num_tasks, num_points

    @property
    def num_units(self):
        return self.num_tasks

    def sample(self, units, seeds):
        draws = torch.from_numpy(2 * task_uniform(seeds, 1 + 2 * self.num_points) - 1)
        slope, x = draws[:, :1, None], draws[:, 1:, None].float()
        y = (slope * x).float()
        k = self.num_points
        n = len(units)
        return MetaBatch(
            support=TaskSet(x[:, :k].contiguous(), y[:, :k].contiguous()),
            query=TaskSet(x[:, k:].contiguous(), y[:, k:].contiguous()),
            entity_index=torch.as_tensor(units, dtype=torch.int64),
            stratum=torch.zeros(n, dtype=torch.int64),
            split_time=torch.full((n,), -1, dtype=torch.int64),
        )
"""


def test_a_user_sampler_module_is_imported_and_trained_from_the_command(tmp_path, monkeypatch):
    (tmp_path / "user_samplers_for_test.py").write_text(USER_SAMPLER)
    monkeypatch.chdir(tmp_path)
    config = tiny_config(
        tmp_path / "run",
        "imports=[user_samplers_for_test]",
        "sampler.name=user_lines",
        "sampler.options={num_tasks: 40, num_points: 3}",
        "trainer.meta_steps=3",
    )
    assert config.sampler.options == {"num_tasks": 40, "num_points": 3}
    result = train(config)
    assert result.step == 3 and result.loss == result.loss
    state = latest_checkpoint_state(config.resolved_run_dir)
    assert state["config"]["imports"] == ["user_samplers_for_test"]
    # A fresh process rebuilding the run from its checkpoint (as metadist.eval does)
    # imports the module again.
    rebuild = (
        "from metadist.tasks import registered_task_samplers\n"
        "from metadist.train import latest_checkpoint_state\n"
        "from metadist.train.config import build_config\n"
        f"build_config(latest_checkpoint_state({str(config.resolved_run_dir)!r})['config'])\n"
        "assert 'user_lines' in registered_task_samplers()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", rebuild], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_a_received_run_imports_nothing_unless_allowed(tmp_path, monkeypatch):
    # A run whose config lists a module beside it: a fresh `metadist eval` of it must not
    # run that module's code unless the user allows it by name.
    (tmp_path / "received_module_for_test.py").write_text(
        USER_SAMPLER.replace('"user_lines"', '"received_lines"')
        + "\nimport pathlib\npathlib.Path('module_ran').write_text('yes')\n"
    )
    monkeypatch.chdir(tmp_path)
    config = tiny_config(
        tmp_path / "run",
        "imports=[received_module_for_test]",
        "sampler.name=received_lines",
        "sampler.options={num_tasks: 40, num_points: 3}",
        "trainer.meta_steps=2",
    )
    train(config)
    (tmp_path / "module_ran").unlink(missing_ok=True)
    command = [sys.executable, "-m", "metadist.cli", "eval", f"run_dir={tmp_path / 'run'}"]
    refused = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert "--allow-import received_module_for_test" in refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert not (tmp_path / "module_ran").exists()  # its code never ran
    allowed = subprocess.run(
        [
            *command,
            "--allow-import",
            "received_module_for_test",
            "eval.max_tasks=4",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Allowed, the module is imported (whatever the evaluation of this sampler says next).
    assert (tmp_path / "module_ran").exists(), allowed.stderr
    assert "allow-import" not in allowed.stderr, allowed.stderr


def test_an_unregistered_sampler_name_points_to_imports(tmp_path):
    from metadist.train.build import build_parts
    from metadist.train.distributed import read_env

    # A name no test module registers (the registry is process-wide under pytest).
    config = tiny_config(tmp_path / "run", "sampler.name=never_registered_windows")
    with pytest.raises(
        ValueError, match="unknown task sampler 'never_registered_windows'.*imports="
    ):
        build_parts(config, read_env("cpu"))


def test_an_unimportable_module_is_named(tmp_path, monkeypatch):
    """A module that is not there, one written `.py`, one whose own import is missing,
    and one that raises: each one line saying which it is (and where)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="imports: no module 'no_such_module_xyz'; it must be"):
        tiny_config(tmp_path / "run", "imports=[no_such_module_xyz]")
    (tmp_path / "needs_more_xyz.py").write_text("import not_installed_xyz\n")
    (tmp_path / "raises_xyz.py").write_text("X = 1\nY = 1 / 0\n")
    with pytest.raises(ValueError, match=r"'needs_more_xyz.py' is a file; name the module, "
                       r"without .py: 'needs_more_xyz'"):  # fmt: skip
        tiny_config(tmp_path / "run", "imports=[needs_more_xyz.py]")
    with pytest.raises(ValueError, match=r"module 'needs_more_xyz' was found but its import "
                       r"failed: No module named 'not_installed_xyz' \(at .*needs_more_xyz.py:1\)"):  # fmt: skip
        tiny_config(tmp_path / "run", "imports=[needs_more_xyz]")
    with pytest.raises(ValueError, match=r"module 'raises_xyz' failed on import: "
                       r"ZeroDivisionError: division by zero \(at .*raises_xyz.py:2\)"):  # fmt: skip
        tiny_config(tmp_path / "run", "imports=[raises_xyz]")
    # an error raised in the standard library by the user's line: that line
    (tmp_path / "badjson_xyz.py").write_text("import json\nCFG = json.loads('{')\n")
    with pytest.raises(ValueError, match=r"module 'badjson_xyz' failed on import: "
                       r"JSONDecodeError: .* \(at .*badjson_xyz.py:2\)"):  # fmt: skip
        tiny_config(tmp_path / "run", "imports=[badjson_xyz]")
    # a syntax error, and a name registered twice: the user's file and line, not metadist's
    (tmp_path / "syntax_xyz.py").write_text("X = 1\nY = (\n")
    with pytest.raises(ValueError, match=r"module 'syntax_xyz' failed on import: SyntaxError: "
                       r".* \(at .*syntax_xyz.py:2\)"):  # fmt: skip
        tiny_config(tmp_path / "run", "imports=[syntax_xyz]")
    (tmp_path / "twice_xyz.py").write_text(
        "from metadist.tasks import TaskSampler, register_task_sampler\n\n\n"
        "@register_task_sampler('sinusoid')\nclass Again(TaskSampler):\n    pass\n"
    )
    with pytest.raises(ValueError, match=r"module 'twice_xyz' failed on import: .*already "
                       r"registered by .* \(at .*twice_xyz.py:4\)"):  # fmt: skip
        tiny_config(tmp_path / "run", "imports=[twice_xyz]")


def test_num_threads_applies_while_training_and_is_restored(tmp_path):
    before = torch.get_num_threads()
    seen = []
    config = tiny_config(
        tmp_path / "run", "trainer.meta_steps=2", "trainer.eval_every=1", "trainer.num_threads=1"
    )
    train(config, on_eval=lambda step, values: seen.append(torch.get_num_threads()))
    assert seen == [1, 1]
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="trainer.num_threads must be >= 1"):
        tiny_config(tmp_path / "run", "trainer.num_threads=0")


def test_cosine_schedule_with_warmup_is_logged_and_resumes_exactly(tmp_path):
    import math

    schedule = [
        "trainer.meta_steps=10",
        "trainer.eval_every=4",
        "trainer.checkpoint_every=4",
        "logging.log_every=1",
        "optimizer.schedule=cosine",
        "optimizer.warmup_steps=2",
    ]
    assert train(tiny_config(tmp_path / "straight", *schedule)).step == 10
    logged = [r["lr"] for r in read_metrics(tmp_path / "straight") if r["split"] == "train"]
    lr = 1e-3  # sinusoid_maml's optimizer.lr
    expected = [lr / 2, lr] + [lr * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)]
    assert logged == pytest.approx(expected)

    # Stopped after 4 steps and resumed, the schedule continues where it was.
    def sigterm_at_four(step, values):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    four = train(tiny_config(tmp_path / "resumed", *schedule), on_eval=sigterm_at_four)
    assert four.step < 10 and four.stopped_by == "SIGTERM"
    resumed = train(tiny_config(tmp_path / "resumed", *schedule))
    assert resumed.step == 10
    assert_bit_identical(
        latest_checkpoint_state(tmp_path / "straight")["learner"],
        latest_checkpoint_state(tmp_path / "resumed")["learner"],
    )
    with pytest.raises(ValueError, match="optimizer.schedule"):
        tiny_config(tmp_path / "bad", "optimizer.schedule=linear")


def test_the_first_metrics_record_after_a_resume_averages_the_whole_window(tmp_path):
    # Records every 6 steps; stopped by SIGTERM after step 3, inside the record of steps
    # 1-6, which after the resume must average all six steps as the straight run does.
    schedule = [
        "trainer.meta_steps=10",
        "trainer.eval_every=3",
        "logging.log_every=6",
        "trainer.check_every=1",
    ]
    train(tiny_config(tmp_path / "straight", *schedule))

    def sigterm_at_three(step, values):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    stopped = train(tiny_config(tmp_path / "resumed", *schedule), on_eval=sigterm_at_three)
    assert 3 <= stopped.step < 6 and stopped.stopped_by == "SIGTERM"
    train(tiny_config(tmp_path / "resumed", *schedule))

    def records(run):
        return [
            (r["step"], r["loss"], r["query_loss_after"])
            for r in read_metrics(tmp_path / run)
            if r["split"] == "train"
        ]

    assert [r[0] for r in records("straight")] == [6, 10]
    assert records("resumed") == records("straight")


def test_the_header_says_a_learner_is_first_order(tmp_path):
    """`learner=fomaml` is maml with first_order: the header says so (it said maml)."""
    from metadist.train.build import build_parts
    from metadist.train.distributed import read_env
    from metadist.train.header import run_header

    env = read_env("cpu")
    config = tiny_config(tmp_path / "run", "learner=fomaml")
    assert "; maml (first order) on mlp;" in run_header(config, env, build_parts(config, env))
    config = tiny_config(tmp_path / "run", "learner.options.first_order=false")
    assert "; maml on mlp;" in run_header(config, env, build_parts(config, env))
