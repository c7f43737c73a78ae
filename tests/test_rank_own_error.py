"""A sampler of one's own that fails on rank 1 alone, in a 2-rank `metadist train
--nproc-per-node=2`: rank 1 said nothing (only local rank 0 printed errors, as for a
config error every rank meets alike), so the run ended with torchrun's line "its own
message is above" above no message. The rank that meets an error in its meta-steps
says it, naming itself, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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
    """
)


@pytest.mark.timeout(240)
def test_an_error_of_rank_one_alone_is_one_line_naming_it(tmp_path):
    (tmp_path / "rank_one_sampler.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    command = [
        *[sys.executable, "-m", "metadist.cli", "train", "--nproc-per-node=2", "--no-eval"],
        *["experiment=sinusoid_maml", "imports=[rank_one_sampler]"],
        *["sampler.name=rank_one_fails", "trainer.meta_batch_size=4", "trainer.meta_steps=6"],
        *["trainer.num_threads=1", "logging.progress=false", "logging.wandb.mode=disabled"],
        f"run_dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if "no tasks for rank one" in line]
    assert said == [
        "metadist train: error: on rank 1: RuntimeError: no tasks for rank one "
        f"(at {tmp_path / 'rank_one_sampler.py'}:15)"
    ], done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        ("torchrun: the process of rank 1 exited with status 1 (its own message is above)",
         "torchrun: the process of rank 1 failed (its own message is above)")
    ), done.stderr  # fmt: skip
