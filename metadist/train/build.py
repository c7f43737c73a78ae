"""Building a run's parts from its config: store → sampler → partitioner → loaders → model →
learner → optimizer.

`build_task_source` (store → sampler → partitioner → shapes) is the one construction of a
run's tasks: training (`build_parts`), evaluation (`metadist.eval.run`) and sweeps
(`metadist.launch.sweep`) all go through it, so they cannot disagree on a split.

Everything here runs before the process group forms, so a bad sampler option, an unknown
model or a meta-batch a rank's split cannot fill stops every rank at once with a
`ValueError` naming it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from metadist.batch import MetaBatch
from metadist.data import BatchMetaDataLoader, StratifiedTaskPartitioner
from metadist.learners import LEARNERS, Learner, build_learner, get_learner, registered_learners
from metadist.models import MODELS, build_model, registered_models
from metadist.store import SeriesStore
from metadist.store.identity import check_store_identity, check_store_integrity, store_identity
from metadist.tasks import SAMPLERS, TaskSampler, build_task_sampler, registered_task_samplers
from metadist.tasks.class_messages import sized_classes
from metadist.tasks.first_batch import example_shapes, first_batch
from metadist.tasks.units import checked_num_units, checked_unit_rows
from metadist.train.component_errors import naming, users_errors
from metadist.train.config import TrainConfig
from metadist.train.distributed import DistEnv
from metadist.train.model_check import check_model_output, check_trainable
from metadist.train.optim import build_optimizer, scheduled_lr
from metadist.train.resources import (
    available_memory,
    check_memory,
    count_parameters,
    estimate_memory,
)
from metadist.train.selection import check_val_metric

__all__ = ["RunParts", "TaskSource", "build_parts", "build_task_source", "scheduled_lr"]


@dataclass
class RunParts:
    """The built components of a run.

    Attributes:
        sampler: the task sampler.
        partitioner: the stratified split of the sampler's units.
        train_loader: this rank's meta-train loader (`meta_batch_size / world_size` tasks
            per batch).
        val_loader: this rank's meta-val loader, or `None` when evaluation is off (or
            meta-val has no share of the units).
        learner: the learner (not wrapped in DDP), on `env.device`.
        optimizer: the meta-optimizer over the learner's parameters.
        input_shape: one example's input shape, e.g. `(1,)` or `(L, F)`.
        output_shape: one prediction's shape, e.g. `(1,)` or `(H, T)`.
        store: the open series store, or `None`.
        store_identity: its identity (`metadist.store.identity`), recorded in checkpoints.
    """

    sampler: TaskSampler
    partitioner: StratifiedTaskPartitioner
    train_loader: BatchMetaDataLoader
    val_loader: BatchMetaDataLoader | None
    learner: Learner
    optimizer: torch.optim.Optimizer
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    store: SeriesStore | None = None
    store_identity: dict[str, Any] | None = None


@dataclass
class TaskSource:
    """Where a run's tasks come from: what `build_task_source` returns.

    Attributes:
        store: the open series store, or `None` for samplers that need none.
        store_identity: its identity (`metadist.store.identity`), or `None`.
        sampler: the task sampler built from `sampler.name` / `sampler.options`.
        partitioner: the run's split of the sampler's units (`data.*`, `trainer.seed`).
        input_shape: one example's input shape, e.g. `(1,)` or `(L, F)`.
        task_output_shape: one target's shape as the tasks give it (`(H, T)`, or one
            logit per class).
        output_shape: the model's output shape: `model.output_shape` where set (an
            embedding), else `task_output_shape`.
        example: the sampler's first batch, checked; `None` where rebuilt from a record.
    """

    store: SeriesStore | None
    store_identity: dict[str, Any] | None
    sampler: TaskSampler
    partitioner: StratifiedTaskPartitioner
    input_shape: tuple[int, ...]
    task_output_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    example: MetaBatch | None = None


def build_task_source(
    config: TrainConfig,
    *,
    verify_store: bool | None = None,
    notes: bool = True,
    trained_on: tuple[dict[str, Any] | None, str] | None = None,
) -> TaskSource:
    """Opens the store, builds the sampler and the run's partitioner, and reads the shapes.

    Args:
        verify_store: recompute the store's checksums first; `None` follows
            `data.verify_store`.
        notes: say on stderr what the split made of the data (strata drawn together,
            N lowered by `fit_ways`); training does, and a trained run's parts rebuilt
            for evaluation or inference said it when it trained.
        trained_on: `(identity, who)` of the store a trained run recorded: the store is
            checked against it before anything is built from it (another store, which
            a split or the user's sampler might refuse first, is named as such).

    Raises:
        ValueError: the sampler rejects its options (naming `sampler.options.<key>`).
        FileNotFoundError: `data.store` is missing.
    """
    store, identity = open_store(config, verify_store)
    if store is not None and trained_on is not None:
        check_store_identity(trained_on[0], store, trained_on[1])
    with naming(
        "sampler", _unknown_hint("sampler", config.sampler.name, registered_task_samplers())
    ):
        options = config.sampler.read_options(SAMPLERS)
        sampler = build_task_sampler(config.sampler.name, store, options=options)
    with users_errors("sampler"):  # the user's code too, where the sampler is theirs
        num_units = checked_num_units(sampler)
    if num_units == 0:  # before the partitioner blames data.fractions for it
        where = f" of store {store.path}" if store is not None else ""
        raise ValueError(
            f"sampler {config.sampler.name!r} has no units (tasks) to draw from{where} with "
            f"sampler.options {dict(config.sampler.options or {})}: check its options (e.g. "
            "a window longer than every series)"
        )
    seed = config.trainer.seed
    with users_errors("sampler"):  # its unit_strata
        partitioner = config.data.partitioner(sampler, store, seed)
    if notes:
        _note_merged_strata(partitioner, store, config.data.fractions)
    fit_ways = getattr(sampler, "fit_ways_to", None)  # N-way samplers: N the splits can give
    if fit_ways is not None:
        # N as configured: the sampler may have lowered it to the store's classes already
        asked = getattr(getattr(sampler, "options", None), "num_ways", None)
        fit_ways(partitioner)
        short = _check_splits_give_tasks(sampler, partitioner)  # before training, and the note
        ways = getattr(sampler, "num_ways", None)
        if notes and ways != asked and os.environ.get("RANK", "0") == "0":
            print(
                f"note: sampler.options.num_ways={asked} lowered to {ways}: the "
                "split with fewest classes of K + Q examples has that many "
                "(sampler.options.fit_ways=false refuses instead)",
                file=sys.stderr,
            )
        if notes and short and os.environ.get("RANK", "0") == "0":
            print(short, file=sys.stderr)
    example = first_batch(sampler, config.sampler.name, seed)
    input_shape, task_output_shape = example_shapes(example, sampler)
    output_shape = task_output_shape
    if config.model.output_shape is not None:  # e.g. the embedding of a prototypical network
        output_shape = tuple(config.model.output_shape)
    return TaskSource(
        store=store,
        store_identity=identity,
        sampler=sampler,
        partitioner=partitioner,
        input_shape=input_shape,
        task_output_shape=task_output_shape,
        output_shape=output_shape,
        example=example,
    )


def _note_merged_strata(
    partitioner: StratifiedTaskPartitioner, store: SeriesStore | None, fractions: Any
) -> None:
    """One note (from the first rank) naming the strata too small to split on their own."""
    merged = getattr(partitioner, "merged_strata", [])
    if not merged or os.environ.get("RANK", "0") != "0":
        return
    names = [str(n) for n in getattr(store, "stratum_names", [])]
    shown = [str(names[c]) if 0 <= c < len(names) else str(c) for c in merged]
    print(
        f"note: stratum {', '.join(shown)} has too few units for data.fractions="
        f"{list(fractions)}; drawn together as one remainder stratum for the split",
        file=sys.stderr,
    )


def build_parts(config: TrainConfig, env: DistEnv) -> RunParts:
    """Builds every component of the run for this rank.

    The model is initialised from `trainer.seed` alone, so every rank starts from the
    same parameters (DDP broadcasts rank 0's anyway).

    Raises:
        ValueError: a component rejects its options (the message names it), or the
            sampler yields tasks the model cannot take.
        FileNotFoundError: `data.store` is missing.
    """
    source = build_task_source(config)
    train_loader, val_loader = build_loaders(config, env, source)
    learner = build_run_learner(config, env, source)
    optimizer = build_optimizer(config.optimizer, learner.parameters())
    return RunParts(
        sampler=source.sampler,
        partitioner=source.partitioner,
        train_loader=train_loader,
        val_loader=val_loader,
        learner=learner,
        optimizer=optimizer,
        input_shape=source.input_shape,
        output_shape=source.output_shape,
        store=source.store,
        store_identity=source.store_identity,
    )


_TRAIN_HINT = (
    "to fix: lower trainer.meta_batch_size (keeping it a multiple of the number of "
    "ranks), give meta-train a larger share in data.fractions, or use a store with more "
    "units"
)
_VAL_HINT = (
    "to fix: lower trainer.meta_batch_size (keeping it a multiple of the number of "
    "ranks), give meta-val a larger share in data.fractions (e.g. "
    "data.fractions=[0.6,0.2,0.2]), or turn meta-val off with trainer.eval_every=0"
)


def build_loaders(
    config: TrainConfig, env: DistEnv, source: TaskSource
) -> tuple[BatchMetaDataLoader, BatchMetaDataLoader | None]:
    """This rank's `(meta-train loader, meta-val loader or None)` over `source`'s split.

    Raises:
        ValueError: a loader option the sampler cannot serve, or a split that cannot fill
            a rank's batch (naming the fields to change).
    """
    sampler, partitioner = source.sampler, source.partitioner
    wants_rows = config.data.order == "blocked" or (config.data.read_ahead or 0) > 0
    rows = sampler.unit_rows() if wants_rows else None
    if rows is not None:  # the sampler's fault, checked before the loaders name batch fields
        checked_unit_rows(sampler, rows)
    if wants_rows and rows is None:
        raise ValueError(
            f"data.order={config.data.order} / data.read_ahead={config.data.read_ahead}: sampler "
            f"{config.sampler.name!r} does not say which store rows its units read; use "
            "data.order=random with data.read_ahead unset"
        )
    options = _loader_options(config, env)
    if config.trainer.fit_meta_batch:  # a panel of a few series trains in smaller batches
        options["batch_size"] = _fitted_batch(partitioner, "train", env, options["batch_size"])
    batch_fields = (
        f"trainer.meta_batch_size={config.trainer.meta_batch_size} over {env.world_size} "
        f"rank(s), data.fractions={list(config.data.fractions)}"
    )
    with naming(batch_fields, _TRAIN_HINT, component="sampler"):
        train_loader = BatchMetaDataLoader(sampler, partitioner, split="train", **options)
    if len(train_loader) < 1:
        raise ValueError(
            f"trainer.meta_batch_size={config.trainer.meta_batch_size}: a rank's meta-train "
            f"split yields no full batch per epoch; {_TRAIN_HINT}"
        )
    if config.trainer.eval_every <= 0:
        return train_loader, None
    if not config.evaluates_meta_val:
        # A recipe that selects on meta-val, on data too small to spare one (a UCR set of
        # a few classes, split class-disjointly into meta-train and meta-test only).
        if env.rank == 0:
            print(
                f"note: data.fractions={list(config.data.fractions)} gives meta-val no "
                f"share: trainer.eval_every={config.trainer.eval_every} has nothing to "
                "evaluate, so no checkpoint is selected and no patience applies; the run "
                "trains all trainer.meta_steps",
                file=sys.stderr,
            )
        return train_loader, None
    # A small meta-val split (a small data set, or a model whose tasks only some series
    # can give) is still monitored, in smaller batches.
    val_options = dict(options)
    val_options["batch_size"] = _fitted_batch(partitioner, "val", env, options["batch_size"])
    with naming(
        f"{batch_fields} (meta-val, trainer.eval_every > 0)", _VAL_HINT, component="sampler"
    ):
        val_loader = BatchMetaDataLoader(sampler, partitioner, split="val", **val_options)
    return train_loader, val_loader


def _fitted_batch(
    partitioner: StratifiedTaskPartitioner, split: str, env: DistEnv, batch_size: int
) -> int:
    """A rank's batch of `split`: `batch_size`, or the tasks the split holds per rank and
    epoch where they are fewer (and at least one), with a note."""
    per_rank = len(partitioner.units(split)) // env.world_size
    if not 0 < per_rank < batch_size:
        return batch_size
    if env.rank == 0:
        print(
            f"note: meta-{split} has {per_rank} task(s) per rank and epoch, fewer than the "
            f"{batch_size} of a meta-batch: its batches hold {per_rank}",
            file=sys.stderr,
        )
    return per_rank


def _loader_options(config: TrainConfig, env: DistEnv) -> dict[str, Any]:
    """The `BatchMetaDataLoader` keywords of this rank's meta-train loader (`data.*`)."""
    data = config.data
    options: dict[str, Any] = {
        "batch_size": config.trainer.meta_batch_size // env.world_size,
        "seed": config.trainer.seed,
        "rank": env.rank,
        "world_size": env.world_size,
        "num_workers": data.num_workers,
        "pin_memory": env.device.type == "cuda" if data.pin_memory is None else data.pin_memory,
        "order": data.order,
        "block_bytes": data.block_bytes,
        "window_blocks": data.window_blocks,
        "read_ahead": data.read_ahead,
        "release": data.release,
    }
    if data.num_workers > 0:
        options["persistent_workers"] = data.persistent_workers
        if data.prefetch_factor is not None:
            options["prefetch_factor"] = data.prefetch_factor
    return options


def build_run_learner(config: TrainConfig, env: DistEnv, source: TaskSource) -> Learner:
    """The run's model (initialised from `trainer.seed`) inside its learner, on `env.device`.

    Raises:
        ValueError: an unknown model or learner, or options they reject (naming the field).
    """
    torch.manual_seed(config.trainer.seed)
    with naming("model", _unknown_hint("model", config.model.name, registered_models())):
        options = config.model.read_options(MODELS)

        def make() -> nn.Module:
            return build_model(
                config.model.name, source.input_shape, source.output_shape, options=options
            )

        check_run_memory(config, env, make)
        model = make()
    check_model_output(model, config.model.name, source.example, source.output_shape)
    with naming("learner", _unknown_hint("learner", config.learner.name, registered_learners())):
        config.learner.read_options(LEARNERS)
        learner = build_learner(config.learner.name, model, **config.learner.options)
    check_trainable(learner, model, config.model.name)
    learner.to(env.device)
    return learner


def open_store(
    config: TrainConfig, verify: bool | None = None
) -> tuple[SeriesStore | None, dict[str, Any] | None]:
    """`(store, identity)` of `data.store` (`(None, None)` without one), its checksums
    recomputed first when `verify` (`None`: unless `data.verify_store=false`).

    Raises:
        FileNotFoundError: no store there.
        ValueError: a damaged store (naming the file).
    """
    if config.data.store is None:
        return None, None
    store = SeriesStore.open(config.data.store)
    if config.data.verify_store if verify is None else verify:
        check_store_integrity(store)
    return store, store_identity(store)


_IMPORTS_HINT = (
    "; a {kind} of your own is registered when its module is imported: name the module in "
    "imports (imports=[my_module], importable from the working directory or PYTHONPATH)"
)


def check_components(config: TrainConfig) -> None:
    """The sampler's, model's and learner's names and options read against their
    registries, nothing built: what `build_parts` would refuse about them, found before
    a process starts (a sweep's trials, a launch on several ranks).

    Raises:
        ValueError: an unknown name or option, or a value of the wrong type, naming it.
    """
    for kind, registry, registered in (
        ("sampler", SAMPLERS, registered_task_samplers),
        ("model", MODELS, registered_models),
        ("learner", LEARNERS, registered_learners),
    ):
        component = getattr(config, kind)
        with naming(kind, _unknown_hint(kind, component.name, registered())):
            component.read_options(registry)
    check_val_metric(
        "selection.metric", config.selection.metric, config.learner.name, learner_loss(config)
    )


def _check_splits_give_tasks(sampler: Any, partitioner: Any) -> str:
    """Every split in use can give the N-way sampler's tasks: a meta-test split of one
    class was found by the evaluation after the whole training.

    Returns:
        A note naming the classes of meta-train and meta-val too small to be drawn (the
        evaluation's header names meta-test's), or "".

    Raises:
        ValueError: naming the split and, from the sampler, what to change.
    """
    short = []
    for split in ("train", "val", "test"):
        units = np.asarray(partitioner.units(split), dtype=np.int64)
        if len(units):
            try:
                confined = sampler.confined_to(units)
            except ValueError as error:
                raise ValueError(f"the meta-{split} split cannot give tasks: {error}") from None
            classes = getattr(confined, "short_classes", {})
            if classes and split != "test":
                short.append(f"meta-{split}: {sized_classes(classes)}")
    if not short:
        return ""
    per_class = sampler.num_shots + sampler.num_query
    return (
        f"note: classes with fewer than num_shots + num_query = {per_class} entities in "
        f"their split are never drawn: {'; '.join(short)}"
    )


def learner_loss(config: TrainConfig) -> str | None:
    """The loss of the config's learner (its `loss` option, default included), or None
    where the learner has none or its options do not read (refused where it is built)."""
    try:
        options = config.learner.read_options(LEARNERS)
    except (ValueError, KeyError):
        return None
    loss = getattr(options, "loss", None)
    return loss if isinstance(loss, str) else None


def _unknown_hint(kind: str, name: str, registered: list[str]) -> str | None:
    """What to do about a component name no module has registered."""
    return None if name in registered else _IMPORTS_HINT.format(kind=kind)[2:]


def check_run_memory(config: TrainConfig, env: DistEnv, make: Callable[[], nn.Module]) -> None:
    """Refuses, before any allocation, a run whose memory lower bound exceeds what the
    machine has (`train.resources`): the model is first built on the meta device.

    Raises:
        ValueError: one line with the estimate and the fields that decide it.
    """
    try:
        num_parameters = count_parameters(make)
    except ValueError:
        raise
    except Exception:  # noqa: BLE001 - a model that cannot be built on `meta`: not estimated
        return
    options = dict(config.learner.options)
    learner = get_learner(config.learner.name)
    defaults = getattr(
        learner, "Options", None
    )  # the learner's own defaults (Reptile: 5, first order)
    inner_steps = options.get("inner_steps", getattr(defaults, "inner_steps", 1))
    first_order = options.get("first_order", getattr(defaults, "first_order", False))
    estimate = estimate_memory(
        num_parameters,
        tasks_per_rank=max(1, config.trainer.meta_batch_size // env.world_size),
        inner_steps=int(inner_steps) if learner.has_inner_loop else 0,
        first_order=bool(first_order) or config.learner.name == "fomaml",
    )
    available = available_memory() if env.device.type == "cpu" else None
    check_memory(
        estimate,
        available,
        "model.options (its sizes), trainer.meta_batch_size or learner.options.inner_steps",
    )
