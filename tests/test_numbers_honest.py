"""Numbers that are never silently wrong: store identity and integrity, divergence reported,
non-finite settings refused, the documented synthetic path."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.datasets import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
from metadist.eval import EvalOptions, evaluate_run, evaluate_tasks
from metadist.eval.report import markdown_report
from metadist.store import ingest
from metadist.store.verify import verify
from metadist.train.__main__ import main as train_main

ROOT = Path(__file__).resolve().parent.parent


def _store(directory: Path, seed: int) -> Path:
    panel = write_synthetic_panel(
        directory / f"panel{seed}", num_entities=60, length_range=(200, 260), seed=seed
    )
    ingest(panel.out_dir, directory / "store", **SYNTHETIC_INGEST_ARGS, progress=False)
    return directory / "store"


def _train(store: Path, run_dir: Path, *extra: str) -> int:
    return train_main(
        [
            "experiment=synthetic_maml",
            f"data.store={store}",
            f"run_dir={run_dir}",
            "trainer.meta_batch_size=4",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=2",
            "logging.progress=false",
            "logging.wandb.mode=disabled",
            "--no-eval",
            *extra,
        ]
    )


def test_a_store_replaced_at_the_same_path_is_refused_by_resume_and_eval(tmp_path, capsys):
    store = _store(tmp_path, seed=1)
    assert _train(store, tmp_path / "run", "trainer.meta_steps=2") == 0
    # the same data ingested again is the same store
    ingest(tmp_path / "panel1", store, **SYNTHETIC_INGEST_ARGS, progress=False)
    evaluate_run(
        tmp_path / "run", overrides=["eval.scratch_steps=0", "eval.max_tasks=4"], write=False
    )
    # another panel at the same path
    other = _store(tmp_path / "other", seed=2)
    import shutil

    shutil.rmtree(store)
    shutil.copytree(other, store)
    capsys.readouterr()
    assert _train(store, tmp_path / "run", "trainer.meta_steps=4") == 1
    error = capsys.readouterr().err
    assert f"data.store {store} is not the store the run in {tmp_path / 'run'}" in error
    assert "it recorded (" in error and "the store now has (" in error
    with pytest.raises(ValueError, match="is not the store run_dir .* was trained on"):
        evaluate_run(tmp_path / "run", overrides=["eval.scratch_steps=0"], write=False)


def test_a_flipped_byte_stops_training_before_any_step(tmp_path, capsys):
    store = _store(tmp_path, seed=3)
    values = store / "values.bin"
    data = bytearray(values.read_bytes())
    data[len(data) // 2] ^= 0x40
    values.write_bytes(bytes(data))
    assert _train(store, tmp_path / "run", "trainer.meta_steps=2") == 1
    assert "values.bin is corrupt" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="values.bin is corrupt"):
        verify(store)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_verify_fails_on_damaged_entity_stats(tmp_path, damage):
    store = _store(tmp_path, seed=4)
    verify(store)
    stats = store / "entity_stats.npz"
    if damage == "missing":
        stats.unlink()
        match = "entity_stats.npz is missing"
    else:
        stats.write_bytes(stats.read_bytes()[: stats.stat().st_size // 2])
        match = "entity_stats.npz is unreadable"
    with pytest.raises(ValueError, match=match):
        verify(store)


class _Exploding(torch.nn.Module):
    """A regression 'learner' whose adapted predictions blow up on some tasks."""

    loss = "mse"
    has_inner_loop = True
    eval_inner_steps = 1

    def __init__(self, bad: set[int], value: float):
        super().__init__()
        self.bad, self.value = bad, value
        self.model = torch.nn.Identity()

    def adapt(self, support, steps=None):
        return {"adapted": steps != 0}

    def predict(self, params, x):
        out = torch.zeros(x.shape[0], x.shape[1], 1, dtype=torch.float64)
        if params["adapted"]:
            for b in self.bad:
                out[b] = self.value
        return out


@pytest.mark.parametrize("value", [float("nan"), 8.6e71])
def test_a_diverging_method_is_reported_not_averaged(value, capsys):
    x = torch.linspace(-1, 1, 4 * 5).reshape(4, 5, 1)
    batch = MetaBatch(
        support=TaskSet(x, torch.sin(x)),
        query=TaskSet(x, torch.sin(x)),
        entity_index=torch.full((4,), -1),
        stratum=torch.zeros(4, dtype=torch.int64),
        split_time=torch.full((4,), -1),
    )
    result, _ = evaluate_tasks(_Exploding({1, 3}, value), [batch], options=EvalOptions())
    adapted = result["overall"]["adapted"]["mse"]
    assert adapted["num_diverged"] == 2 and not np.isfinite(adapted["value"])
    assert result["overall"]["unadapted"]["mse"]["num_diverged"] == 0
    assert np.isfinite(result["overall"]["unadapted"]["mse"]["value"])
    assert result["diverged"] == {"adapted": 2}
    table = markdown_report(result)
    assert "diverged (2/4 tasks)" in table and "e+71" not in table
    assert "diverged on 2 of 4 tasks" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("learner.options.inner_lr=nan", "learner.options.inner_lr"),
        ("learner.options.inner_lr=inf", "learner.options.inner_lr"),
        ("optimizer.lr=1e400", "optimizer.lr"),
        ("eval.scratch_lr=nan", "eval.scratch_lr"),
    ],
)
def test_non_finite_settings_are_refused_before_any_run_directory(
    tmp_path, capsys, override, field
):
    code = train_main(
        [
            "experiment=sinusoid_maml",
            f"run_dir={tmp_path / 'run'}",
            "trainer.meta_steps=2",
            override,
        ]
    )
    assert code == 1
    assert f"{field} must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _readme_synthetic_ingest() -> list[str]:
    text = (ROOT / "docs" / "data.md").read_text()
    block = re.search(r"(metadist ingest data/synthetic/panel .*?)\n```", text, re.S)
    assert block, "the synthetic ingest line of docs/data.md is gone"
    return shlex.split(block.group(1).replace("\\\n", " "))


def test_the_readme_and_synth_ingest_lines_agree_with_the_library():
    args = _readme_synthetic_ingest()
    assert "--scaling" in args and args[args.index("--scaling") + 1] == "per-entity"
    assert args[args.index("--nan") + 1] == SYNTHETIC_INGEST_ARGS["nan"]
    assert SYNTHETIC_INGEST_ARGS["scaling"] == "per-entity"


@pytest.mark.integration
def test_the_documented_synthetic_path_gives_a_scored_model(tmp_path):
    """`metadist synth`, then the documented ingest line verbatim, then synthetic_maml."""
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 300}
    synth = subprocess.run(
        [
            sys.executable,
            "-m",
            "metadist.cli",
            "synth",
            "data/synthetic/panel",
            "--entities",
            "60",
            "--length-range",
            "200",
            "300",
        ],
        **run,
    )
    assert synth.returncode == 0, synth.stderr
    printed = re.search(r"ingest\s+(metadist ingest .*)", synth.stdout).group(1)
    assert "--scaling per-entity" in printed and "--nan ffill" in printed
    args = _readme_synthetic_ingest()
    done = subprocess.run([sys.executable, "-m", "metadist.cli", *args[1:]], **run)
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "data/synthetic/store/metadata.json").read_text())
    assert meta["scaling"]["kind"] == "per-entity"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "metadist.train",
            "experiment=synthetic_maml",
            "data.store=data/synthetic/store",
            "trainer.meta_steps=20",
            "trainer.meta_batch_size=4",
            "trainer.eval_every=0",
            "logging.wandb.mode=disabled",
            "eval.scratch_steps=0",
        ],
        **run,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "runs/synthetic_maml/eval/metrics.json").read_text())
    assert np.isfinite(result["overall"]["adapted"]["mase"]["value"])
    assert "scaling per-entity" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("value", "scaling", "why"),
    [(1e39, "none", "would be inf"), (1e200, "global", "overflows the global scaling")],
)
def test_values_a_store_cannot_hold_are_refused_by_name(tmp_path, value, scaling, why):
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = np.arange(20, dtype=np.float64)
    values[13] = value
    pq.write_table(
        pa.table({"id": ["a"] * 10 + ["b"] * 10, "t": np.arange(20) % 10, "v": values}),
        tmp_path / "in.parquet",
    )
    with pytest.raises(ValueError) as caught:
        ingest(
            tmp_path / "in.parquet",
            tmp_path / "store",
            entity_col="id",
            time_col="t",
            features=["v"],
            scaling=scaling,
            progress=False,
        )
    message = str(caught.value)
    assert "in.parquet: row 13: column 'v' of entity 'b'" in message and why in message, message
    assert "\n" not in message and not (tmp_path / "store").exists()
    # the largest float32 value itself is stored
    values[13] = 3e38
    pq.write_table(
        pa.table({"id": ["a"] * 10 + ["b"] * 10, "t": np.arange(20) % 10, "v": values}),
        tmp_path / "ok.parquet",
    )
    store = ingest(
        tmp_path / "ok.parquet",
        tmp_path / "ok",
        entity_col="id",
        time_col="t",
        features=["v"],
        scaling="none",
        progress=False,
    )
    assert np.isfinite(np.asarray(store.values)).all()


def test_a_forecast_after_a_history_of_zeros_is_not_an_explosion():
    """A history of zeros (an intermittent or new series) put the divergence threshold
    at 1e-6: a forecast of 0.01 turned the method's row into "diverged"."""
    from metadist.eval.task_scores import diverged, diverged_rows

    assert not diverged_rows(np.array([[0.01, 0.02]]), np.array([0.0]))[0]
    assert not diverged(np.array([0.01]), np.zeros(5))
    assert diverged_rows(np.array([[8.6e71]]), np.array([0.0]))[0]  # still an explosion
    assert diverged_rows(np.array([[2e-2]]), np.array([1e-9]))[0]  # relative elsewhere
