"""A run's logs that cannot be written (a file where a log directory goes, a directory
where `metrics.jsonl` goes, a read-only log directory, wandb not installed) are one line
naming the setting, before anything is built or written (the real CLI, real stores)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_runs import tiny_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# `metadist train`, with the wandb package made unimportable when asked (as uninstalled)
TRAIN = """
import sys
if sys.argv[1] == "no-wandb":
    sys.modules["wandb"] = None
from metadist.cli import main
sys.exit(main(["train", *sys.argv[2:]]))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tiny_store(tmp_path_factory.mktemp("log_sinks"), num_entities=12, seed=3)


def _train(store, run_dir: Path, *overrides: str, wandb: bool = True, prefix=()):
    argv = [
        *prefix,
        sys.executable,
        "-c",
        TRAIN,
        "wandb" if wandb else "no-wandb",
        "experiment=synthetic_maml",
        f"data.store={store.path}",
        f"run_dir={run_dir}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=2",
        "trainer.eval_every=0",
        "logging.progress=false",
        "--no-eval",
        *overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    env.pop("WANDB_MODE", None)
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)


def _one_line(done: subprocess.CompletedProcess, *words: str) -> str:
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("metadist train: error: "), done.stderr
    for word in words:
        assert word in lines[0], done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("in_the_way", "overrides", "words"),
    [
        ("tensorboard", ["logging.tensorboard=true"], ["logging.tensorboard=true"]),
        ("wandb", ["logging.wandb.mode=offline"], ["logging.wandb.mode=offline"]),
    ],
)
def test_a_file_where_a_log_directory_goes(store, tmp_path, in_the_way, overrides, words):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / in_the_way).write_text("not a directory")
    done = _train(store, run_dir, *overrides)
    _one_line(done, *words, str(run_dir / in_the_way), "not a directory")
    # nothing written: no config, no inference record, no metrics, no checkpoint
    assert sorted(p.name for p in run_dir.iterdir()) == [in_the_way]


def test_a_directory_where_the_metrics_go(store, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "metrics.jsonl").mkdir(parents=True)
    done = _train(store, run_dir, "logging.wandb.mode=disabled")
    _one_line(done, str(run_dir / "metrics.jsonl"), "not a file")
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]


def test_wandb_selected_but_not_installed(store, tmp_path):
    run_dir = tmp_path / "run"
    done = _train(store, run_dir, "logging.wandb.mode=offline", wandb=False)
    _one_line(done, "logging.wandb.mode=offline", "wandb package")
    assert not run_dir.exists()
    # disabled, it is not needed
    done = _train(store, run_dir, "logging.wandb.mode=disabled", wandb=False)
    assert done.returncode == 0, done.stderr


def _read_only_mounts() -> bool:
    """Whether this machine lets an unprivileged namespace bind-mount read-only."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0"', str(Path.cwd())],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _read_only_mounts(), reason="no read-only bind mounts here")
def test_a_read_only_log_directory_of_a_resumed_run(store, tmp_path):
    run_dir = tmp_path / "run"
    done = _train(store, run_dir, "logging.tensorboard=true", "logging.wandb.mode=disabled")
    assert done.returncode == 0, done.stderr
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    board = run_dir / "tensorboard"
    # the same run continued, its tensorboard directory read-only (mounted so)
    mount = f'mount --bind -o ro {board} {board} && exec "$@"'
    done = _train(
        store,
        run_dir,
        "trainer.meta_steps=4",
        "logging.tensorboard=true",
        "logging.wandb.mode=disabled",
        prefix=["unshare", "-rm", "sh", "-c", mount, "sh"],
    )
    _one_line(done, "logging.tensorboard=true", str(board), "read-only file system")
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
