"""Resuming a run: finding its latest checkpoint, checking that it is the same experiment,
and restoring the learner, optimizer, loader and random number generators.

`resume` is what `train` does first on every rank; `finished_before` answers, in a
fraction of a second, whether a run directory already holds a finished run of a config
(all its meta-steps, or stopped early: `metadist competition` and the demo skip training
it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from metadist.learners import LEARNERS
from metadist.options import to_plain
from metadist.store import SeriesStore
from metadist.store.identity import check_store_identity
from metadist.train.build import RunParts
from metadist.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from metadist.train.compose import load_config
from metadist.train.config import PretrainConfig, TrainConfig, without_nulls
from metadist.train.distributed import DistEnv
from metadist.train.logging import new_run_id
from metadist.train.rng import seed_rank, set_rng_state
from metadist.train.selection import restore_best, stopped_early

# Sections that define what a run computes: resuming with any of them changed would
# silently continue a different experiment.
_RUN_IDENTITY = (
    ("sampler",),
    ("model",),
    ("learner",),
    ("optimizer",),
    # not ("data", "store"): the store is checked by its identity, not by its path, so a
    # run whose store moved (a renamed competition output) resumes from the new path
    ("data", "fractions"),
    ("data", "pinned_test_units"),
    ("data", "split_by"),
    ("data", "stratify_by"),
    ("trainer", "seed"),
    ("pretrain",),
)

# What every checkpoint a training writes holds, and a resume restores.
_TRAINING_STATE = ("learner", "optimizer", "loader")

# Sections added to the identity after runs were saved without them: a saved run lacking
# one had its defaults.
_ADDED_SECTIONS: dict[tuple[str, ...], type] = {("pretrain",): PretrainConfig}

# Options added to a section after runs were saved without them, with the value such a
# run had (the option's default then and now): a run that lacks one resumes where it is
# still that value, and is refused where it is set otherwise.
_ADDED_OPTIONS: dict[tuple[str, ...], Any] = {("model", "options", "head_init"): "default"}


def _with_added_options(key: tuple[str, ...], saved: Any, current: Any) -> Any:
    """The saved settings of section `key`, with every option of `_ADDED_OPTIONS` that
    the run was saved without and the current settings have (a model that takes it) set
    to the value it had."""
    for path, value in _ADDED_OPTIONS.items():
        if path[: len(key)] != key:
            continue
        inner = path[len(key) :]
        if _has(current, inner) and not _has(saved, inner) and _has(saved, inner[:-1]):
            saved = _copied_with(saved, inner, value)
    return saved


def _has(tree: Any, path: tuple[str, ...]) -> bool:
    """Whether nested dicts `tree` hold `path`."""
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _copied_with(tree: dict, path: tuple[str, ...], value: Any) -> dict:
    """`tree` with `value` at `path` (the dicts along it copied, `tree` unchanged)."""
    head, *rest = path
    return {**tree, head: _copied_with(tree[head], tuple(rest), value) if rest else value}


class Resumed(NamedTuple):
    """Where a run starts: its step, identity, the checkpoint it resumed from (None for a
    fresh start), the partial sums of the metrics record under way at that step and the
    record of its model selection (`Selection.state`; None before any)."""

    step: int
    run_id: str
    checkpoint: Path | None
    metrics_window: dict[str, Any] | None
    selection: dict[str, Any] | None = None


def resume(config: TrainConfig, env: DistEnv, parts: RunParts) -> Resumed:
    """Restores the run from the latest checkpoint, or starts it fresh.

    Raises:
        ValueError: the run directory holds a run of other settings, or of another store.
        CheckpointError: the latest checkpoint is truncated or foreign.
    """
    run_dir = config.resolved_run_dir
    found = latest_checkpoint(run_dir)
    if found is None:
        # Every rank draws differently from here on (dropout masks), reproducibly.
        seed_rank(config.trainer.seed, env)
        run_id = new_run_id() if env.is_main else ""
        return Resumed(0, run_id, None, None)
    path, pointer = found
    state = load_checkpoint(path, pointer)
    missing = [key for key in _TRAINING_STATE if key not in state]
    if missing:  # written by save_checkpoint, but not by a training
        raise CheckpointError(
            f"checkpoint {path} holds no training state to resume ({', '.join(missing)} "
            "missing): move it away, or use another run_dir"
        )
    check_same_run(state.get("config", {}), config.to_dict(), run_dir)
    check_same_store_path(state, config.data.store, run_dir)
    if parts.store is not None:
        check_store_identity(state.get("store_identity"), parts.store, f"the run in {run_dir}")
    parts.learner.load_state_dict(state["learner"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.train_loader.load_state_dict(state["loader"])
    rng = state.get("rng", [])
    if state.get("world_size") == env.world_size and len(rng) == env.world_size:
        set_rng_state(rng[env.rank], env)
    else:
        seed_rank(config.trainer.seed + int(state["step"]), env)
    if env.is_main:
        restore_best(run_dir, state.get("selection"))
    return Resumed(
        int(state["step"]),
        str(state.get("run_id", "")),
        path,
        state.get("metrics_window"),
        state.get("selection"),
    )


def check_same_run(saved: dict, current: dict, run_dir: Path, new_run: str | None = None) -> None:
    """Refuses to resume a run under other settings, naming the first setting that differs
    and how to start a new run with it: `new_run` (e.g. "another --out", for a command
    that chooses the run directory itself), by default a free `run_dir=...`.

    Raises:
        ValueError: a setting of `_RUN_IDENTITY` differs (nulls ignored: a run resumes
            after an upgrade lists a new, null option).
    """
    for key in _RUN_IDENTITY:
        before: Any = saved
        now: Any = current
        for part in key:
            before = before.get(part) if isinstance(before, dict) else None
            now = now.get(part) if isinstance(now, dict) else None
        if before is None and key in _ADDED_SECTIONS:  # a run saved before the section existed
            before = to_plain(_ADDED_SECTIONS[key]())
        before = _with_added_options(key, before, now)
        before, now = without_nulls(before), without_nulls(now)
        if before != now:
            path, was, wanted = _first_difference(list(key), before, now)
            name = ".".join(path)
            if new_run is None:
                new_run = f"run_dir={_new_run_dir(run_dir, path[-1], wanted)}"
            raise ValueError(
                f"run_dir {run_dir} holds a run with {name}={_shown(was)}, but this command "
                f"has {name}={_shown(wanted)}; resume with the same settings, or start a new "
                f"run with {new_run}"
            )


def check_same_store_path(state: dict, store: str | None, run_dir: Path) -> None:
    """A run saved before stores had a recorded identity is its store by its path: the
    same `data.store` (resolved), as runs were then checked. A run with an identity is
    checked by it instead (`check_store_identity`), wherever its store now is.

    Raises:
        ValueError: no recorded identity and another store path.
    """
    if state.get("store_identity") is not None:
        return
    saved = (state.get("config", {}).get("data") or {}).get("store")
    if saved is None and store is None:
        return
    if saved is None or store is None or Path(saved).resolve() != Path(store).resolve():
        raise ValueError(
            f"run_dir {run_dir} holds a run with data.store={saved!r} (saved before stores "
            f"had a recorded identity), but this command has data.store={store!r}; resume "
            "it on the same store, or start a new run with another run_dir"
        )


def finished_before(
    overrides: list[str], run_dir: Path, config_dir: str | os.PathLike | None = None
) -> bool:
    """Whether `run_dir` holds a finished run of the training `overrides` describe (in
    the experiments of `config_dir`, where given): all its meta-steps or stopped early,
    the same settings and the same store, as the training command itself would find
    before saying "nothing to train". Checked in a fraction of a second, where starting
    the training for it takes seconds (`metadist competition`, the demo; a sweep asks it
    of a trial that exited before its last step). Any doubt answers False: the training
    then runs, and it resumes the run or says what is wrong."""
    try:
        found = latest_checkpoint(run_dir)
        if found is None:
            return False
        path, pointer = found
        config = load_config(overrides, config_dir)
        state = load_checkpoint(path, pointer)  # the pointer's size and SHA-256 checked
        finished = int(state.get("step", -1)) >= config.trainer.meta_steps
        loss = str(getattr(config.learner.read_options(LEARNERS), "loss", ""))
        stopped = config.evaluates_meta_val and stopped_early(
            config.selection, loss, state.get("selection")
        )
        if not finished and not stopped:
            return False
        check_same_run(state.get("config", {}), config.to_dict(), run_dir)
        check_same_store_path(state, config.data.store, run_dir)
        if config.data.store is not None:
            store = SeriesStore.open(config.data.store)
            check_store_identity(state.get("store_identity"), store, f"the run in {run_dir}")
    except (ValueError, TypeError, KeyError, OSError, CheckpointError):
        return False
    return True


def _first_difference(path: list[str], before: Any, now: Any) -> tuple[list[str], Any, Any]:
    """The path and both values of the first leaf where two settings differ."""
    if isinstance(before, dict) and isinstance(now, dict):
        for name in [*before, *(k for k in now if k not in before)]:
            if before.get(name) != now.get(name):
                return _first_difference([*path, str(name)], before.get(name), now.get(name))
    return path, before, now


def _shown(value: Any) -> str:
    return "(not set)" if value is None else repr(value)


def _new_run_dir(run_dir: Path, name: str, value: Any) -> str:
    """`<run_dir>.<name>-<value>` (a free directory), e.g. runs/sinusoid_maml.inner_lr-0.02."""
    if isinstance(value, (list, tuple)):
        value = "x".join(str(v) for v in value)
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{name}-{value}").strip("_")[:40] or "new"
    candidate = Path(f"{run_dir}.{text}")
    number = 2
    while candidate.exists():
        candidate = Path(f"{run_dir}.{text}-{number}")
        number += 1
    return str(candidate)
