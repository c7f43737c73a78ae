"""The cache shared between runs: a second run's first evaluation on the same store and
episodes reuses the baselines the first run's evaluation computed (the very numbers),
a changed setting misses, and the cache is atomic, bounded and never trusts a damaged or
another code version's file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from tiny_runs import tiny_store, train_tiny

from metadist.eval import baselines, evaluate_run
from metadist.eval import run as eval_run
from metadist.eval import shared_cache as shared_module
from metadist.eval.cache import PRETRAINED_FILE, EvalCache
from metadist.eval.shared_cache import SharedCache, shared_cache_root

ROOT = Path(__file__).resolve().parent.parent


def _entries(seed: int, num: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    return {
        f"key{seed}-{i}": {"theta": rng.normal(size=(4, 1)), "naive": rng.normal(size=(4, 1))}
        if i % 2
        else rng.normal(size=(2, 3)).astype(np.float32)
        for i in range(num)
    }


def test_entries_kept_by_one_cache_are_found_by_another(tmp_path):
    kept = _entries(0)
    SharedCache(tmp_path).put_all(kept)
    other = SharedCache(tmp_path)
    for key, value in kept.items():
        found = other.get(key)
        if isinstance(value, dict):
            assert found.keys() == value.keys()
            for name in value:
                np.testing.assert_array_equal(found[name], value[name])
        else:
            assert found.dtype == value.dtype
            np.testing.assert_array_equal(found, value)
    assert other.get("another key") is None


def test_the_root_is_the_environment_variable_else_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("METADIST_CACHE", str(tmp_path / "mine"))
    assert shared_cache_root() == tmp_path / "mine" / "eval"
    monkeypatch.delenv("METADIST_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert shared_cache_root() == tmp_path / "xdg" / "metadist" / "eval"
    monkeypatch.setenv("METADIST_CACHE_MAX_MB", "lots")
    with pytest.raises(ValueError, match="METADIST_CACHE_MAX_MB"):
        SharedCache(tmp_path)


def test_another_version_of_the_code_does_not_see_the_entries(tmp_path, monkeypatch):
    SharedCache(tmp_path).put_all(_entries(0))
    monkeypatch.setattr(shared_module, "code_fingerprint", lambda: "0123456789abcdef")
    assert SharedCache(tmp_path).get("key0-0") is None


def test_a_damaged_pack_is_ignored_and_the_others_still_serve(tmp_path, capsys):
    SharedCache(tmp_path).put_all(_entries(0))
    SharedCache(tmp_path).put_all(_entries(1))
    cache = SharedCache(tmp_path)
    packs = sorted((cache.directory / "packs").glob("*.npz"))
    assert len(packs) == 2
    keys = {path: shared_module.read_index(path) for path in packs}
    packs[0].write_bytes(b"not a pack")
    fresh = SharedCache(tmp_path)
    assert all(fresh.get(key) is None for key in keys[packs[0]])
    assert all(fresh.get(key) is not None for key in keys[packs[1]])
    assert "ignoring" in capsys.readouterr().err


def test_the_cache_is_trimmed_to_its_bound_least_recently_used_first(tmp_path):
    cache = SharedCache(tmp_path, limit=10**9)
    for seed in range(3):
        cache.put_all(_entries(seed))
    packs = sorted((cache.directory / "packs").glob("*.npz"))
    size = packs[0].stat().st_size
    for age, path in enumerate(packs):  # the first written is the least recently used
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    SharedCache(tmp_path).get(shared_module.read_index(packs[0])[0])  # used: now the newest
    bounded = SharedCache(tmp_path, limit=int(2.5 * size))
    bounded.trim()
    left = sorted((cache.directory / "packs").glob("*.npz"))
    assert left == [packs[0], packs[2]]


def test_concurrent_writers_leave_whole_files(tmp_path):
    """Writers of the same and of other entries at once: every pack reads whole."""
    errors = []

    def write(seed: int) -> None:
        try:
            for _ in range(5):
                SharedCache(tmp_path).put_all(_entries(seed % 2, num=40))
        except Exception as error:  # pragma: no cover - the test fails on it
            errors.append(error)

    threads = [threading.Thread(target=write, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    reader = SharedCache(tmp_path)
    for seed in (0, 1):
        for key, value in _entries(seed, num=40).items():
            found = reader.get(key)
            expected = value["theta"] if isinstance(value, dict) else value
            np.testing.assert_array_equal(
                found["theta"] if isinstance(value, dict) else found, expected
            )
    assert not list((reader.directory / "packs").glob(".*"))  # no temporary file left


def test_an_eval_cache_takes_what_its_run_lacks_from_the_shared_cache(tmp_path):
    shared = SharedCache(tmp_path / "shared")
    first = EvalCache(tmp_path / "run1" / "eval", shared)
    first.put("from-scratch predictions", "k", np.arange(3.0))
    first.save()
    second = EvalCache(tmp_path / "run2" / "eval", SharedCache(tmp_path / "shared"))
    np.testing.assert_array_equal(second.get("from-scratch predictions", "k"), np.arange(3.0))
    assert second.get("from-scratch predictions", "other") is None
    summary = second.summary()
    assert summary == f"from-scratch predictions (from {shared.directory})"
    second.save()  # kept in the run's own directory too: its next evaluation needs no other
    alone = EvalCache(tmp_path / "run2" / "eval")
    np.testing.assert_array_equal(alone.get("from-scratch predictions", "k"), np.arange(3.0))
    assert len(list((shared.directory / "packs").glob("*.npz"))) == 1  # nothing new to share

    # what a run kept before (or without) the shared cache is offered to it
    other = SharedCache(tmp_path / "other")
    third = EvalCache(tmp_path / "run2" / "eval", other)
    assert third.get("from-scratch predictions", "k") is not None
    third.save()
    assert SharedCache(tmp_path / "other").get("k") is not None


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    return tiny_store(root, num_entities=64, seed=1)


def _train(store, run_dir, *overrides):
    return train_tiny(
        store,
        run_dir,
        "experiment=synthetic_protonet",
        "data.fractions=[0.5,0,0.5]",
        "sampler.options.num_ways=2",
        "sampler.options.num_shots=1",
        "sampler.options.num_query=2",
        "sampler.options.lookback=16",
        *overrides,
    )


@pytest.fixture(scope="module")
def two_runs(store, tmp_path_factory):
    """Two runs of one store and split that differ in their meta-training (the learning
    rate), as a researcher comparing settings has them."""
    root = tmp_path_factory.mktemp("two_runs")
    return _train(store, root / "a", "optimizer.lr=0.001"), _train(
        store, root / "b", "optimizer.lr=0.003"
    )


EVAL = ["eval.scratch_steps=3", "eval.pretrain_steps=6", "eval.tasks_per_unit=1"]
BASELINES = ("scratch", "nearest_centroid", "one_nn", "pretrained", "baseline_pp")


def _scores(result):
    return {m: s[result["primary_metric"]]["value"] for m, s in result["overall"].items()}


def _forget(run_dir: Path) -> None:
    """As if `run_dir` had never been evaluated: no baselines in its own directory."""
    for path in (run_dir / "eval").glob("*"):
        if path.is_file():
            path.unlink()


@pytest.mark.integration
def test_a_second_runs_first_evaluation_reuses_the_first_runs_baselines(two_runs, monkeypatch):
    run_a, run_b = two_runs
    _forget(run_a)
    evaluate_run(run_a, overrides=EVAL, write=False, progress=False)
    computed = evaluate_run(run_b, overrides=EVAL, write=False, progress=False, shared_cache=False)
    assert "reused" not in computed["settings"]
    _forget(run_b)

    def no_training(*args, **kwargs):
        raise AssertionError("the pretrained embedding was trained again")

    monkeypatch.setattr(baselines, "pretrain_embedding", no_training)
    reused = evaluate_run(run_b, overrides=EVAL, write=False, progress=False)
    shared = str(SharedCache().directory)
    summary = reused["settings"]["reused"]
    for kind in ("pretrained embedding", "from-scratch predictions", "Baseline++"):
        assert kind in summary
    assert summary.endswith(f"(from {shared})")
    scores, expected = _scores(reused), _scores(computed)
    assert {m: scores[m] for m in BASELINES} == {m: expected[m] for m in BASELINES}
    assert scores == expected  # the meta-trained model's own predictions too
    assert reused["per_task"] == computed["per_task"]
    assert (run_b / "eval" / PRETRAINED_FILE).is_file()  # now the run's own too

    # a changed setting misses: another from-scratch learning rate is trained again
    other = evaluate_run(
        run_b, overrides=[*EVAL, "eval.scratch_lr=0.05"], write=False, progress=False
    )
    assert "from-scratch predictions" not in other["settings"]["reused"]
    assert "pretrained embedding" in other["settings"]["reused"]


@pytest.mark.integration
def test_metadist_eval_reuses_another_runs_pretrained_embedding_unless_told_not_to(two_runs):
    run_a, run_b = two_runs
    _forget(run_a)
    evaluate_run(run_a, overrides=EVAL, write=False, progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "metadist.cli", "eval", f"run_dir={run_b}", *EVAL]
    for flag, shared in (("--no-shared-cache", False), (None, True)):
        _forget(run_b)
        done = subprocess.run(
            [*command, *([flag] if flag else [])],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        reused = [line for line in done.stdout.splitlines() if "reused: " in line]
        assert bool(reused and "pretrained embedding" in reused[0]) is shared, done.stdout


def test_without_a_home_directory_the_evaluation_goes_on_without_sharing(monkeypatch, capsys):
    monkeypatch.delenv("METADIST_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert eval_run._shared(True) is None and "METADIST_CACHE" in capsys.readouterr().err
    assert eval_run._shared(False) is None
