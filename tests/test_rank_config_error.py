"""An error a rank other than 0 meets alone before its meta-steps (here a sampler of
one's own that refuses to be built on rank 1), in a 2-rank `metadist train
--nproc-per-node=2`: rank 1 stayed quiet, as for a config error every rank meets alike,
so no line named the error or its rank, and torchrun's line said "its own message is
above" over nothing. The launcher now says the line that rank left it, naming rank 1;
an error every rank meets alike is still said once."""

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


    @register_task_sampler("rank_one_refuses")
    class RankOneRefuses(SinusoidSampler):
        def __init__(self, *args, **kwargs):
            if os.environ.get("RANK") == "1":
                raise ValueError("sampler.options.amplitude: refused on rank one")
            super().__init__(*args, **kwargs)
    """
)
TINY = [
    *["trainer.meta_steps=4", "trainer.num_threads=1", "logging.progress=false"],
    "logging.wandb.mode=disabled",
]


@pytest.mark.timeout(240)
def test_an_error_of_rank_one_alone_before_its_steps_is_said_naming_it(tmp_path):
    (tmp_path / "rank_one_config.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    command = [
        *[sys.executable, "-m", "metadist.cli", "train", "--nproc-per-node=2", "--no-eval"],
        *["experiment=sinusoid_maml", "imports=[rank_one_config]"],
        *["sampler.name=rank_one_refuses", "trainer.meta_batch_size=4", *TINY],
        f"run_dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "metadist train: error: on rank 1: sampler.options.amplitude: refused on rank one "
        f"(at {tmp_path / 'rank_one_config.py'}:12)",
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
