"""A small synthetic store and two-step trainings on it, for the evaluation tests."""

from __future__ import annotations

from pathlib import Path

from metadist.datasets.synthetic import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
from metadist.store.ingest import ingest
from metadist.train.__main__ import main as train_main


def tiny_store(root: Path, num_entities: int, seed: int):
    """A store of `num_entities` synthetic series of 60–80 steps (2 profiles, no NaN)."""
    write_synthetic_panel(
        root / "panel", num_entities=num_entities, length_range=(60, 80), seed=seed,
        num_profiles=2, nan_fraction=0.0, progress=False,
    )  # fmt: skip
    return ingest(root / "panel", root / "store", progress=False, **SYNTHETIC_INGEST_ARGS)


def train_tiny(store, run_dir: Path, *overrides: str) -> Path:
    """`run_dir` after 2 meta-steps of 2 tasks on `store` (no evaluation), `overrides` last."""
    common = [
        f"data.store={store.path}",
        f"run_dir={run_dir}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=2",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "--no-eval",
    ]
    assert train_main([*common, *overrides]) == 0
    return run_dir


def ucr_store(root: Path, name: str, num_dims: int = 1):
    """A store of the UCR/UEA set `name` as the shipped sktime/aeon files hold it
    (`metadist datasets ucr` + ingest with the printed arguments); the test is skipped
    where no installed package ships the set."""
    import pytest

    from metadist.datasets.ucr import available_ucr_sets, ucr_ingest_args, write_ucr

    if name not in available_ucr_sets():
        pytest.skip(f"the `ucr` extra (sktime or aeon) with {name} is not installed")
    write_ucr(name, root / "set")
    return ingest(
        root / "set" / "panel.parquet", root / "store", progress=False, **ucr_ingest_args(num_dims)
    )
