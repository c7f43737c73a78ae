"""Settings the round-two battery found unbounded: `data.num_workers=100000` forked until
the machine stalled (about 950 processes, load 360, and the command outlived its
`timeout`), `data.prefetch_factor=10**9` spent minutes queueing indices before the first
step, and a seed beyond 64 bits ended in torch's "Overflow when unpacking long long",
naming no setting. Each is refused in one line naming it, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metadist.train.compose import load_config

BASE = ["experiment=sinusoid_maml", "trainer.meta_steps=2", "trainer.meta_batch_size=2"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.num_workers=100000", "data.num_workers must be <= 256 (processes per rank)"),
        ("data.num_workers=257", "data.num_workers must be <= 256"),
        (
            "data.prefetch_factor=1000000000",
            "data.prefetch_factor must be <= 1,024 (batches ahead)",
        ),
        ("trainer.seed=100000000000000000000000", "trainer.seed must be <= 4,294,967,295"),
        ("trainer.seed=4294967296", "trainer.seed must be <= 4,294,967,295 (a 32-bit seed)"),
    ],
)
def test_an_absurd_setting_is_refused_naming_it(override, message):
    extra = ["data.num_workers=2"] if "prefetch" in override else []
    with pytest.raises(ValueError) as caught:
        load_config([*BASE, *extra, override], world_size=1)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "override", ["data.num_workers=256", "data.prefetch_factor=1024", "trainer.seed=4294967295"]
)
def test_the_bounds_themselves_are_accepted(override):
    extra = ["data.num_workers=2"] if "prefetch" in override else []
    load_config([*BASE, *extra, override], world_size=1)


@pytest.mark.integration
def test_metadist_train_with_a_hundred_thousand_workers_starts_none(tmp_path):
    command = [sys.executable, "-m", "metadist.cli", "train", "--no-eval", *BASE]
    command += [f"run_dir={tmp_path / 'run'}", "data.num_workers=100000"]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.num_workers must be <= 256" in lines[0], lines
    assert not (tmp_path / "run").exists()
