"""Evaluating a training run: rebuild it from its directory and score its held-out tasks.

`evaluate_run(run_dir)` reads the run's config and latest checkpoint, rebuilds its store,
sampler and split, confines the sampler to the evaluated split, scores it with
`metadist.eval.scoring.evaluate_tasks` and writes the report (`metadist eval run_dir=...`
is its command line).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from metadist.eval import baselines
from metadist.eval.archive import keep_previous_evaluation
from metadist.eval.scoring import evaluate_tasks
from metadist.eval.settings import EvalOptions, eval_settings_file, load_eval_options
from metadist.eval.threads import eval_threads


def evaluate_run(
    run_dir: str | os.PathLike,
    *,
    overrides: Iterable[str] = (),
    options: EvalOptions | None = None,
    config_dir: str | None = None,
    write: bool = True,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Evaluates a training run's latest checkpoint on its held-out tasks.

    Rebuilds the run's store, sampler (evaluation protocol), partition, model and learner
    from the config saved in the checkpoint, loads the meta-trained weights, scores every
    method (`evaluate_tasks`) and writes `metrics.json`, `metrics.md`, `tasks.parquet`
    and `forecasts.png` to `<run_dir>/eval/`; an earlier evaluation there with other
    settings moves to `<run_dir>/eval/<its key>/` (`metadist.eval.archive`). With
    `eval.ensemble`, the other runs' checkpoints join this one's (`LearnerEnsemble`).

    Args:
        run_dir: a run directory written by `metadist train`.
        overrides: `eval.KEY=VALUE` settings (see `EvalOptions`), applied over the run's
            own (the `eval` section saved with its config).
        options: the settings, instead of the run's own.
        config_dir: the experiments directory (default: as training looks it up).
        write: write the report files.
        progress: show tasks done as in `evaluate_tasks` (default: a bar on a terminal,
            else a line every 15 s). Evaluation runs on one intra-op thread unless
            `OMP_NUM_THREADS` is set (`progress.eval_threads`).

    Returns:
        The result dict, with `paths` (the files written) added.

    Raises:
        FileNotFoundError: no run directory or no checkpoint in it, or a missing store.
        ValueError: bad settings, or tasks the evaluation protocol cannot score.
    """
    from metadist.models import build_model

    run_dir = Path(run_dir)
    config, state, checkpoint_path, pointer = _load_run(run_dir, "run_dir")
    if options is None:
        options = _run_eval_options(config, run_dir, overrides, config_dir)
    options.validate()
    parts = _eval_parts(config, options, state.get("store_identity"), run_dir)
    learner = _trained_learner(config, state, parts)
    members = [f"{run_dir} ({checkpoint_path.name})"]
    if options.ensemble:
        from metadist.learners.ensemble import LearnerEnsemble

        learners: list[Any] = [learner]
        lookbacks: list[int | None] = [None]
        for member_dir in options.ensemble:
            member, name, lookback = _ensemble_member(Path(member_dir), config, parts)
            learners.append(member)
            lookbacks.append(lookback)
            members.append(f"{member_dir} ({name})")
        learner = LearnerEnsemble(learners, reduce=options.ensemble_reduce, lookbacks=lookbacks)

    classification = getattr(learner, "loss", "mse") == "cross_entropy"

    def build_fresh(output_shape: tuple[int, ...] = parts["task_output_shape"]) -> nn.Module:
        return build_model(
            config.model.name, parts["input_shape"], output_shape, **config.model.options
        )

    # From scratch, a classifier gets one output per way (an embedding network, e.g. of
    # protonet, gets that head in place of its embedding); a forecasting embedding network
    # has no output to train on its own, so the baseline does not apply.
    fresh_model = build_fresh if classification or config.model.output_shape is None else None
    pretrained = None
    tasks = parts["tasks"]
    if classification and options.pretrain_steps > 0 and tasks.labelled_examples is not None:
        embedding_size = int(np.prod(config.model.output_shape or [64]))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(options.seed)
            backbone = build_fresh((embedding_size,))
        pretrained = baselines.pretrain_embedding(
            backbone,
            tasks.labelled_examples,
            num_classes=tasks.num_classes,
            embedding_size=embedding_size,
            steps=options.pretrain_steps,
            lr=options.pretrain_lr,
            batch_size=options.pretrain_batch_size,
            seed=options.seed,
        )

    with eval_threads():
        result, examples = evaluate_tasks(
            learner,
            parts["batches"],
            options=options,
            # forecasts are scored in original units when the sampler names their store
            # columns; other tasks are scored as sampled
            store=parts["store"] if parts["target_columns"] is not None else None,
            target_columns=parts["target_columns"],
            fresh_model=fresh_model,
            progress=progress,
            num_tasks=parts["num_tasks"],
            pretrained=pretrained,
        )
    step = int(state.get("step", pointer.get("step", 0)))
    result["title"] = f"{config.experiment}: evaluation on held-out tasks after {step} meta-steps"
    result["settings"] = {
        "experiment": config.experiment,
        "checkpoint": checkpoint_path.name,
        "learner": config.learner.name,
        "model": config.model.name,
        "tasks": parts["description"],
        **result["settings"],
    }
    if options.ensemble:
        result["settings"]["ensemble"] = f"{options.ensemble_reduce} of " + ", ".join(members)
    if write:
        from metadist.eval.report import write_report

        kept = keep_previous_evaluation(run_dir, result, options, checkpoint_path.name)
        result["paths"] = {k: str(v) for k, v in write_report(result, run_dir, examples).items()}
        result["paths"].update(kept)
    return result


def load_trained(
    run_dir: Path, *, ensemble: Any = None, store: Any = None, source: Any = None
) -> tuple[Path, Any, nn.Module, Any, EvalOptions]:
    """`(run_dir, config, learner, task source, eval options)` of a run's latest checkpoint,
    for adapting it to data of one's own (`metadist.load_run`).

    The learner (with the checkpoints of `ensemble`, default the run's `eval.ensemble`)
    is in eval mode; the store is opened without re-checksumming its values, but its
    identity must match the one the checkpoint recorded. A `source` given (the run's
    recorded parts, `metadist.train.artifact.recorded_source`, when its store is gone)
    replaces the store's; the caller then checks the ensemble members' stores.
    """
    from metadist.store.identity import check_store_identity
    from metadist.train.build import build_task_source

    config, state, _, _ = _load_run(run_dir, "run_dir", store)
    options = _run_eval_options(config, run_dir, (), None)
    recorded = source is not None
    if source is None:
        source = build_task_source(config, verify_store=False)
    if source.store is not None and not recorded:
        check_store_identity(state.get("store_identity"), source.store, f"run_dir {run_dir}")
    parts = {
        "input_shape": source.input_shape,
        "output_shape": source.output_shape,
        "store": None if recorded else source.store,
    }
    learner = _trained_learner(config, state, parts)
    members = list(options.ensemble or []) if ensemble is None else list(ensemble)
    if members:
        from metadist.learners.ensemble import LearnerEnsemble

        learners: list[Any] = [learner]
        lookbacks: list[int | None] = [None]
        for member_dir in members:
            member, _, lookback = _ensemble_member(Path(member_dir), config, parts, store)
            learners.append(member)
            lookbacks.append(lookback)
        learner = LearnerEnsemble(learners, reduce=options.ensemble_reduce, lookbacks=lookbacks)
    learner.eval()
    return run_dir, config, learner, source, options


def _run_eval_options(
    config: Any, run_dir: Path, overrides: Iterable[str], config_dir: str | None
) -> EvalOptions:
    """The run's own evaluation settings (saved with its config); a run trained before
    runs kept them is evaluated with its experiment's eval file, and a note says which."""
    recorded = getattr(config, "eval", None)
    if not recorded:
        path = eval_settings_file(config.experiment, config_dir)
        print(
            f"note: run_dir {run_dir} records no evaluation settings (trained before runs "
            f"kept them); using {path or 'the EvalOptions defaults (no eval file found)'}",
            file=sys.stderr,
        )
    return load_eval_options(config.experiment, overrides, config_dir, recorded=recorded)


def _load_run(
    run_dir: Path, field: str, store: Any = None
) -> tuple[Any, dict[str, Any], Path, dict[str, Any]]:
    """(config, checkpoint state, checkpoint path, pointer) of a run's latest checkpoint;
    `store` replaces the config's `data.store` (a store that moved since training).

    Raises:
        FileNotFoundError: no directory at `run_dir` (named as `field`), or no checkpoint.
    """
    from metadist.train.checkpoint import latest_checkpoint, load_checkpoint
    from metadist.train.config import build_config

    if not run_dir.is_dir():
        raise FileNotFoundError(f"{field}: no run directory at {run_dir}")
    found = latest_checkpoint(run_dir)
    if found is None:
        raise _no_checkpoint_error(run_dir)
    checkpoint_path, pointer = found
    state = load_checkpoint(checkpoint_path, pointer)
    if store is not None:
        saved = state["config"]
        state["config"] = {**saved, "data": {**saved.get("data", {}), "store": str(store)}}
    return build_config(state["config"], world_size=1), state, checkpoint_path, pointer


def _trained_learner(
    config, state: dict[str, Any], parts: dict[str, Any], input_shape: tuple | None = None
) -> nn.Module:
    """The run's learner with the checkpoint's weights (its model taking `input_shape`,
    default the evaluated tasks' input shape)."""
    from metadist.learners import build_learner
    from metadist.models import build_model

    torch.manual_seed(config.trainer.seed)
    model = build_model(
        config.model.name,
        input_shape or parts["input_shape"],
        parts["output_shape"],
        **config.model.options,
    )
    learner = build_learner(config.learner.name, model, **config.learner.options)
    learner.load_state_dict(state["learner"])
    from metadist.train.distributed import evaluation_device

    return learner.to(evaluation_device(config.trainer.device))


def _ensemble_member(
    run_dir: Path, config, parts: dict[str, Any], store: Any = None
) -> tuple[nn.Module, str, int | None]:
    """(learner, checkpoint name, lookback or None) of the ensemble member `run_dir`.

    It must have been trained on the evaluated run's store with the same sampler, up to
    a lookback no longer than the evaluated run's, so that it can forecast its tasks.
    `store` (a store that moved since training) replaces the member's `data.store` too;
    the store's recorded identity is still checked.
    """
    from metadist.train.config import without_nulls

    member, state, checkpoint_path, _ = _load_run(run_dir, "eval.ensemble", store)
    from metadist.tasks import get_task_sampler

    mine = without_nulls(dict(member.sampler.options))
    theirs = without_nulls(dict(config.sampler.options))
    sampler_class = get_task_sampler(config.sampler.name)
    for key in sampler_class.training_only_options:
        mine.pop(key, None)
        theirs.pop(key, None)
    lookback = None
    if sampler_class.ensemble_may_shorten_lookback and mine.get("lookback") != theirs.get(
        "lookback"
    ):
        lookback = int(mine.get("lookback") or 0)
        if not 0 < lookback < int(theirs.get("lookback") or 0):
            raise ValueError(
                f"eval.ensemble: {run_dir} looks back {mine.get('lookback')} rows, more than "
                f"the evaluated run's {theirs.get('lookback')}; evaluate the run with the "
                "longest lookback and list the others as members"
            )
        for key in ("lookback", "pad_inputs"):
            mine.pop(key, None)
            theirs.pop(key, None)
    for setting, a, b in (
        ("data.store", member.data.store, config.data.store),
        ("sampler.name", member.sampler.name, config.sampler.name),
        ("sampler.options", mine, theirs),
    ):
        if a != b:
            raise ValueError(
                f"eval.ensemble: {run_dir} was trained with {setting}={a!r}, the evaluated "
                f"run with {b!r}; members must see the same tasks"
            )
    if parts["store"] is not None:
        from metadist.store.identity import check_store_identity

        check_store_identity(
            state.get("store_identity"), parts["store"], f"eval.ensemble member {run_dir}"
        )
    input_shape = None if lookback is None else (lookback, *parts["input_shape"][1:])
    return _trained_learner(member, state, parts, input_shape), checkpoint_path.name, lookback


def _no_checkpoint_error(run_dir: Path) -> FileNotFoundError:
    """The error for a run_dir without a checkpoint, pointing at run directories inside it."""
    from metadist.train.checkpoint import LATEST, checkpoint_dir

    inside = sorted(
        sub
        for sub in run_dir.iterdir()
        if sub.is_dir() and (checkpoint_dir(sub) / LATEST).is_file()
    )
    if inside:
        runs = ", ".join(f"run_dir={sub}" for sub in inside)
        return FileNotFoundError(
            f"run_dir {run_dir} has no checkpoint, but it contains a run that has: "
            f"evaluate that instead ({runs})"
        )
    return FileNotFoundError(
        f"run_dir {run_dir} has no checkpoint yet; train first "
        f"(metadist train experiment=NAME run_dir={run_dir})"
    )


def _eval_parts(
    config, options: EvalOptions, recorded_identity: dict | None = None, run_dir: Any = ""
) -> dict[str, Any]:
    """Store, held-out task batches and model shapes of a run, for evaluation.

    The split is rebuilt exactly as training built it (`DataConfig.partitioner`), and the
    sampler's own evaluation protocol (`TaskSampler.for_evaluation`) says which episodes
    of the split are scored: every example of every episode comes from the split.
    """
    from metadist.store.identity import check_store_identity
    from metadist.train.build import build_task_source

    source = build_task_source(config)
    store = source.store
    if store is not None:
        check_store_identity(recorded_identity, store, f"run_dir {run_dir}")
    train_sampler, partitioner = source.sampler, source.partitioner
    input_shape, task_output_shape = source.input_shape, source.task_output_shape
    output_shape = source.output_shape
    if options.split == "all":
        units = np.arange(train_sampler.num_units, dtype=np.int64)
    else:
        units = np.asarray(partitioner.units(options.split), dtype=np.int64)
    if len(units) == 0:
        raise ValueError(
            f"eval.split={options.split!r}: the run's partition has no {options.split} units "
            f"(data.fractions={list(config.data.fractions)})"
        )
    entity_mask = None if options.labels is None else _has_labels(store, options.labels)
    holdout = None if options.holdout is None else _holdout_reader(store, options)
    tasks = train_sampler.for_evaluation(
        units,
        split=options.split,
        tasks_per_unit=options.tasks_per_unit,
        max_tasks=options.max_tasks,
        seed=options.seed,
        entity_mask=entity_mask,
        train_units=partitioner.units("train"),
        holdout=holdout,
        **options.sampler_options,
    )
    if tasks.num_tasks == 0 and options.labels is not None and holdout is None:
        raise ValueError(
            f"eval.labels={options.labels}: none of the {options.split} units has them"
        )
    description = tasks.description
    if options.holdout is not None:
        description += f" from {options.holdout['path']}"
    return {
        "store": store,
        "tasks": tasks,
        "batches": tasks.batches(options.batch_size, options.seed),
        "input_shape": input_shape,
        "output_shape": output_shape,
        "task_output_shape": task_output_shape,
        "target_columns": tasks.target_columns,
        "description": description,
        "num_tasks": tasks.num_tasks,
    }


def _has_labels(store, labels: list[str]) -> np.ndarray:
    """`[E]` bool: the store's entities with one of `labels` (`ValueError` for unknown ones)."""
    if store is None:
        raise ValueError("eval.labels needs a series store (entities with labels)")
    try:
        return store.has_label(labels)
    except ValueError as error:
        raise ValueError(f"eval.labels: {error}") from None


def _holdout_reader(store, options: EvalOptions):
    """The `HoldoutReader` of `eval.holdout`: the sampler reads the columns it forecasts
    (or the spec's `value_cols`) and checks which of its entities the file covers."""
    from metadist.eval.holdout import HoldoutReader

    if store is None:
        raise ValueError("eval.holdout needs a forecast sampler on a series store")
    assert options.holdout is not None  # only called with a holdout
    spec = dict(options.holdout)
    known = {"path", "entity_col", "time_col", "value_cols", "partial"}
    unknown = sorted(set(spec) - known)
    if unknown or "path" not in spec:
        raise ValueError(
            "eval.holdout needs path (and optionally entity_col, time_col, value_cols, "
            f"partial); "
            f"got {sorted(spec)}"
        )

    return HoldoutReader(
        path=spec["path"],
        store=store,
        entity_col=spec.get("entity_col", "entity_id"),
        time_col=spec.get("time_col", store.metadata.get("time_col", "time")),
        value_cols=spec.get("value_cols"),
        partial=bool(spec.get("partial", False)),
    )
