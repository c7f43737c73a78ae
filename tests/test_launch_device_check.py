"""`metadist train --nproc-per-node=2 trainer.device=cuda` (or `trainer.backend=nccl`) on
a machine without a GPU: the config passed the launcher's checks, torchrun started two
ranks, and each rank's refusal came with torchrun's line after it, where the command
promises a config error in one line before any process starts. The launcher checks
the device and backend its ranks would take."""

from __future__ import annotations

import pytest
import torch

from metadist.cli import main

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without GPU")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("trainer.device=cuda", "trainer.device=cuda but no GPU is visible"),
        ("trainer.backend=nccl", "trainer.backend=nccl needs a GPU per rank"),
    ],
)
def test_a_gpu_asked_for_without_one_is_one_line_before_any_rank(tmp_path, capfd, setting, said):
    run_dir = tmp_path / "run"
    code = main(
        ["train", "--nproc-per-node=2", "experiment=sinusoid_maml", setting,
         "trainer.meta_batch_size=4", "trainer.meta_steps=2", "logging.progress=false",
         "logging.wandb.mode=disabled", f"run_dir={run_dir}", "--no-eval"]
    )  # fmt: skip
    err = capfd.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"metadist train: error: {said}"), err
    assert "torchrun" not in err, err
    assert not run_dir.exists()
