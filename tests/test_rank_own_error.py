"""An error a rank other than 0 meets alone, in a 2-rank `metadist train
--nproc-per-node=2`, is said in one line naming that rank. Rank 1 said nothing before
(only local rank 0 printed errors, as for a config error every rank meets alike), so the
run ended with torchrun's line "its own message is above" above no message: both when the
rank's sampler failed in its meta-steps (the rank says it) and when it refused to be
built before them (the rank leaves its line in torchrun's error file, and the launcher
says it). An error every rank meets alike is still said once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MODULE = textwrap.dedent(
    """
    import os

    from metadist.tasks import register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler

    CALLS = [0]


    @register_task_sampler("rank_one_fails")
    class RankOneFails(SinusoidSampler):
        def sample(self, units, seeds):
            CALLS[0] += 1
            if os.environ.get("RANK") == "1" and CALLS[0] >= 3:  # in its meta-steps
                raise RuntimeError("no tasks for rank one")
            return super().sample(units, seeds)


    @register_task_sampler("rank_one_refuses")
    class RankOneRefuses(SinusoidSampler):
        def __init__(self, *args, **kwargs):
            if os.environ.get("RANK") == "1":
                raise ValueError("sampler.options.amplitude: refused on rank one")
            super().__init__(*args, **kwargs)
    """
)
LINE = {  # the line of MODULE that raises each
    name: next(n for n, line in enumerate(MODULE.splitlines(), 1) if text in line)
    for name, text in (("fails", "raise RuntimeError"), ("refuses", "raise ValueError"))
}
TINY = [
    *["trainer.meta_steps=6", "trainer.num_threads=1", "logging.progress=false"],
    "logging.wandb.mode=disabled",
]


def _train_two_ranks(tmp_path: Path, sampler: str) -> subprocess.CompletedProcess:
    """`metadist train --nproc-per-node=2` of `sinusoid_maml` with the module's `sampler`."""
    (tmp_path / "rank_one_sampler.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    command = [
        *[sys.executable, "-m", "metadist.cli", "train", "--nproc-per-node=2", "--no-eval"],
        *["experiment=sinusoid_maml", "imports=[rank_one_sampler]"],
        *[f"sampler.name={sampler}", "trainer.meta_batch_size=4", *TINY],
        f"run_dir={tmp_path / 'run'}",
    ]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200
    )


@pytest.mark.timeout(240)
def test_an_error_of_rank_one_alone_is_one_line_naming_it(tmp_path):
    done = _train_two_ranks(tmp_path, "rank_one_fails")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if "no tasks for rank one" in line]
    assert said == [
        "metadist train: error: on rank 1: RuntimeError: no tasks for rank one "
        f"(at {tmp_path / 'rank_one_sampler.py'}:{LINE['fails']})"
    ], done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        ("torchrun: the process of rank 1 exited with status 1 (its own message is above)",
         "torchrun: the process of rank 1 failed (its own message is above)")
    ), done.stderr  # fmt: skip


@pytest.mark.timeout(240)
def test_an_error_of_rank_one_alone_before_its_steps_is_said_naming_it(tmp_path):
    done = _train_two_ranks(tmp_path, "rank_one_refuses")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "metadist train: error: on rank 1: sampler.options.amplitude: refused on rank one "
        f"(at {tmp_path / 'rank_one_sampler.py'}:{LINE['refuses']})",
        "torchrun: the process of rank 1 exited with status 1 (its own message is above); "
        "the others were stopped",
    ], done.stderr


@pytest.mark.timeout(240)
@pytest.mark.slow  # the same path runs in the suite's other tests; this one costs seconds
def test_an_error_every_rank_meets_is_said_once(tmp_path):
    command = [
        *[sys.executable, "-m", "metadist.launch.torchrun", "--standalone"],
        *["--nproc_per_node=2", "-m", "metadist.train", "experiment=sinusoid_maml", *TINY],
        f"run_dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "is not divisible" in line]
    assert said == [
        "metadist-train: error: trainer.meta_batch_size=25 is not divisible by the world size "
        "2; the global meta-batch is split evenly over ranks, so choose a multiple of 2"
    ], done.stderr
    assert "Traceback" not in done.stderr and "error file" not in done.stderr, done.stderr
