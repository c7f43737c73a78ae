"""Evaluating a training run: rebuild it from its directory and score its held-out tasks.

`evaluate_run(run_dir)` reads the run's config and checkpoint (the one model selection
kept, else the latest), rebuilds its store,
sampler and split, confines the sampler to the evaluated split (`EvalParts`, in `parts.py`), scores it
with `metadist.eval.scoring.evaluate_tasks` and writes the report (`metadist eval
run_dir=...` is its command line). The learner is rebuilt in `metadist.eval.trained`.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from torch import nn

from metadist.eval.archive import keep_previous_evaluation
from metadist.eval.cache import EvalCache
from metadist.eval.cost import adaptation_steps, cost_line
from metadist.eval.ensemble_paths import members_from_run
from metadist.eval.few_episodes import few_episodes_note
from metadist.eval.forecast_only import check_forecast_only
from metadist.eval.parts import EvalParts, eval_parts
from metadist.eval.pretrained_run import pretrained_backbone
from metadist.eval.report import check_report_writable, write_report
from metadist.eval.scoring import evaluate_tasks, task_kind
from metadist.eval.settings import EvalOptions, eval_settings_file, load_eval_options
from metadist.eval.shard import EvalShard, Reiterable
from metadist.eval.shared_cache import SharedCache
from metadist.eval.threads import eval_threads
from metadist.eval.trained import load_run, trained_learner, with_ensemble
from metadist.models import build_model
from metadist.store.format import check_given_store
from metadist.train.artifact import INFERENCE_FILE, current_store
from metadist.train.build import build_task_source
from metadist.train.checkpoint_use import USE
from metadist.train.config import TrainConfig, store_not_found
from metadist.train.selection import describe_checkpoint


def evaluate_run(
    run_dir: str | os.PathLike,
    *,
    overrides: Iterable[str] = (),
    options: EvalOptions | None = None,
    config_dir: str | None = None,
    write: bool = True,
    progress: bool | None = None,
    allow_imports: Collection[str] = (),
    cache: bool = True,
    shard: EvalShard | None = None,
    shared_cache: bool = True,
    store: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Evaluates a training run's best checkpoint on meta-val (where it kept one), else
    its latest (`eval.checkpoint=latest`: the latest), on its held-out tasks.

    Rebuilds the run's store, sampler (evaluation protocol), partition, model and learner
    from the config saved in the checkpoint, loads the meta-trained weights, scores every
    method (`evaluate_tasks`) and writes `metrics.json`, `metrics.md`, `tasks.parquet`
    and `forecasts.png` to `<run_dir>/eval/`, where the baselines are kept for the next
    evaluation (`metadist.eval.cache`); an earlier evaluation there with other settings
    moves to `<run_dir>/eval/<its key>/` (`metadist.eval.archive`). With `eval.ensemble`,
    the other runs' checkpoints join this one's (`LearnerEnsemble`).

    Args:
        run_dir: a run directory written by `metadist train`.
        overrides: `eval.KEY=VALUE` settings (see `EvalOptions`), applied over the run's
            own (the `eval` section saved with its config).
        options: the settings, instead of the run's own.
        config_dir: the experiments directory (default: as training looks it up).
        write: write the report files.
        progress: show each phase's progress (`evaluate_tasks`'s and the pretraining's;
            default: bars on a terminal, else a line every 15 s). Evaluation runs on one
            intra-op thread unless `OMP_NUM_THREADS` is set (`progress.eval_threads`).
        allow_imports: modules the run's `imports` may import (a loaded run runs no
            code unless allowed; modules already imported need no allowing).
        cache: reuse and keep the baselines (also with `write=False`) in the run's `eval/`,
            and with `shared_cache` in the cache shared between runs.
        shard: this process's share of an evaluation sharded over torchrun ranks
            (`EvalShard.from_env()`): rank 0 writes the report one process would.
        shared_cache: with `cache`, also use the cache shared between runs
            (`metadist.eval.shared_cache`; `metadist eval --no-shared-cache`).
        store: the run's store, where it is now (the one it was trained on). Default:
            where `inference.json` finds it (`metadist.train.artifact.current_store`).

    Returns:
        The result dict, with `paths` (the files written) and `timings` (seconds by
        phase, the report's too; `settings.seconds`: total) added; `{}` on other ranks.

    Raises:
        FileNotFoundError: no run directory or no checkpoint in it, or a missing store.
        ValueError: bad settings, or tasks the evaluation protocol cannot score.
        UnwritableError: with `write`, a report the run directory would refuse (found
            before anything is scored).
    """
    started, run_dir = time.perf_counter(), Path(run_dir)
    store = current_store(run_dir) if store is None else store
    prepared = _prepare(run_dir, store, overrides, options, config_dir, allow_imports)
    config, state, checkpoint_path, pointer, options, parts = prepared
    if write:  # before the work, not after it (every rank: they fail alike)
        check_report_writable(run_dir)
    learner, members = _learner(config, state, parts, options, store, run_dir, allow_imports)
    kept = EvalCache(run_dir / "eval" if cache else None, _shared(cache and shared_cache))
    timings, shard = {"setup": time.perf_counter() - started}, shard or EvalShard()
    result, examples = _score(learner, config, options, parts, progress, kept, timings, shard)
    if not _gather_kept(shard, kept):
        return {}  # rank 0 scores and writes this rank's share
    _describe(result, config, state, checkpoint_path, pointer, parts.description)
    _note_settings(result, options, parts, [f"{run_dir} ({checkpoint_path.name})", *members])
    timings["total"] = time.perf_counter() - started
    _add_timings(result, timings, kept, shard)
    if write:
        archived = keep_previous_evaluation(run_dir, result, options, checkpoint_path.name)
        result["paths"] = _write(result, run_dir, examples, timings, kept, shard)
        result["paths"].update(archived)
    kept.save()  # after the report: a cache that cannot be written costs only time
    return result


def _note_settings(
    result: dict[str, Any], options: EvalOptions, parts: EvalParts, members: list[str]
) -> None:
    """Adds the settings the report states beside the run's: the task protocol's (e.g.
    the split and classes), a note on few episodes, and an ensemble's members (`members`:
    this run's checkpoint first)."""
    result["settings"].update(parts.tasks.settings)
    few = few_episodes_note(result["num_tasks"], options.max_tasks)
    if result["kind"] == "classification" and few:
        result["settings"]["episodes"] = few
    if options.ensemble:
        result["settings"]["ensemble"] = f"{options.ensemble_reduce} of " + ", ".join(members)


def check_evaluation(
    run_dir: str | os.PathLike,
    *,
    overrides: Iterable[str] = (),
    config_dir: str | None = None,
    allow_imports: Collection[str] = (),
    store: str | os.PathLike | None = None,
) -> None:
    """What `evaluate_run` would refuse before scoring (the run, its store, the settings
    and the tasks they give), found by a process that launches ranks to evaluate it:
    one line before any rank starts. Its notes are left to the ranks.

    Raises:
        FileNotFoundError, ValueError, UnwritableError: as `evaluate_run`.
    """
    run_dir = Path(run_dir)
    store = current_store(run_dir) if store is None else store
    with contextlib.redirect_stderr(io.StringIO()):  # the ranks print the notes
        _prepare(run_dir, store, overrides, None, config_dir, allow_imports, verify_store=False)
    check_report_writable(run_dir)


def _prepare(
    run_dir: Path,
    store: str | os.PathLike | None,
    overrides: Iterable[str],
    options: EvalOptions | None,
    config_dir: str | None,
    allow_imports: Collection[str],
    verify_store: bool | None = None,
) -> tuple[TrainConfig, dict[str, Any], Path, dict[str, Any], EvalOptions, EvalParts]:
    """`(config, state, checkpoint path, pointer, options, parts)` of the run evaluated:
    its checkpoint (the latest where `eval.checkpoint=latest`), settings (`options`, else
    the run's with `overrides`) and the tasks they give (`eval_parts`)."""
    if store is not None:
        check_given_store(store)
    try:
        config, state, checkpoint_path, pointer = load_run(
            run_dir, "run_dir", store, allow_imports=allow_imports
        )
    except FileNotFoundError as error:  # the config's data.store, checked as it is read
        raise _store_not_found(run_dir, error) from None
    if options is None:
        options = _run_eval_options(config, run_dir, overrides, config_dir)
    options.validate()
    if options.checkpoint == "latest" and "metric" in pointer:  # the best was loaded
        config, state, checkpoint_path, pointer = load_run(
            run_dir, "run_dir", store, allow_imports=allow_imports, checkpoint="latest"
        )
    identity = state.get("store_identity")
    parts = eval_parts(config, options, identity, run_dir, verify_store=verify_store)
    return config, state, checkpoint_path, pointer, options, parts


def _store_not_found(run_dir: Path, error: FileNotFoundError) -> FileNotFoundError:
    """The error of a run whose store is neither where its record says nor at its
    config's `data.store` (`error`, which offered to build a store): where it looked,
    and `--store`."""
    said = store_not_found(error)
    if not said.startswith("data.store: no series store at"):
        return error
    recorded = (run_dir / INFERENCE_FILE).is_file()
    where = f"not where its {INFERENCE_FILE} records it, and " if recorded else "not found: "
    return FileNotFoundError(
        f"run_dir {run_dir}: its store is {where}{said} (from the working directory); pass "
        "--store PATH (store=PATH) where it is now"
    )


def _shared(use: bool) -> SharedCache | None:
    """The cache shared between runs' evaluations (`$METADIST_CACHE`), where `use`d (and
    there is a place for it: no `$METADIST_CACHE` and no home directory leave it out)."""
    try:
        return SharedCache() if use else None
    except RuntimeError as error:  # Path.home(): no home directory
        print(f"note: no cache shared between runs ({error}); set METADIST_CACHE", file=sys.stderr)
        return None


def _write(
    result: dict[str, Any],
    run_dir: Path,
    examples: list[dict[str, Any]],
    timings: dict[str, float],
    kept: EvalCache,
    shard: EvalShard,
) -> dict[str, str]:
    """Writes the report, its own time (`timings["report"]`, in `total`) included in
    the JSON and markdown; the paths written."""
    started = time.perf_counter()

    def finish(result: dict[str, Any]) -> None:
        timings["report"] = time.perf_counter() - started
        timings["total"] = timings.pop("total") + timings["report"]
        _add_timings(result, timings, kept, shard)

    paths = write_report(result, run_dir, examples, finish=finish)
    return {k: str(v) for k, v in paths.items()}


def _learner(
    config: TrainConfig,
    state: dict[str, Any],
    parts: EvalParts,
    options: EvalOptions,
    store: str | os.PathLike | None,
    run_dir: Path,
    allow_imports: Collection[str],
) -> tuple[nn.Module, list[str]]:
    """The run's meta-trained learner (with `eval.ensemble`'s checkpoints joined to it,
    read with the run's `store` where it was named or found, their `imports` allowed as
    the run's are) and the ensemble's other members, as the report names them."""
    return with_ensemble(
        trained_learner(config, state, parts, who=f"run_dir {run_dir}"),
        config,
        parts,
        options.ensemble or [],
        options.ensemble_reduce,
        store,
        parts.held_out,
        allow_imports=allow_imports,
    )


def _gather_kept(shard: EvalShard, kept: EvalCache) -> bool:
    """Rank 0's cache takes what every rank's used and computed (the from-scratch
    predictions of its batches), so that it keeps them all; whether this is rank 0."""
    shares = shard.gather(kept.share())
    for share in (shares or [])[1:]:
        kept.absorb(share)
    return shard.is_main


def _add_timings(
    result: dict[str, Any], timings: dict[str, float], kept: EvalCache, shard: EvalShard
) -> None:
    """`timings` (seconds by phase) into the result; `settings.seconds` is the whole
    evaluation's, `settings.reused` says which baselines came from the cache, and
    `settings.processes` how a sharded evaluation was shared."""
    result["timings"] = {k: round(v, 2) for k, v in timings.items()}
    result["settings"]["seconds"] = result["timings"]["total"]
    if kept.summary():
        result["settings"]["reused"] = kept.summary()
    if shard.is_sharded:
        result["settings"]["processes"] = shard.describe()


def _score(
    learner: nn.Module,
    config: TrainConfig,
    options: EvalOptions,
    parts: EvalParts,
    progress: bool | None,
    cache: EvalCache,
    timings: dict[str, float],
    shard: EvalShard,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`evaluate_tasks` of the run's tasks (this rank's share of them, when `shard` is
    sharded), with the from-scratch and (classification) pretrained-embedding baselines
    the run's model allows, all on `eval_threads`; `timings` gets each phase's seconds."""
    classification = getattr(learner, "loss", "mse") == "cross_entropy"
    store = parts.store if parts.target_columns is not None else None
    # forecasting's settings, met by other tasks: refused or noted before any work
    notes = check_forecast_only(options, task_kind(learner, store, parts.target_columns))
    progress = progress if shard.is_main else False
    for note in notes if shard.is_main else ():
        print(note, file=sys.stderr)
    build_fresh = _fresh_model_builder(config, parts)
    # From scratch, a classifier gets one output per way (an embedding network, e.g. of
    # protonet, gets that head in place of its embedding); a forecasting embedding network
    # has no output to train on its own, so the baseline does not apply.
    fresh_model = build_fresh if classification or config.model.output_shape is None else None
    if progress is not False:  # the cost up front: what the evaluation will train
        pretrains = options.pretrain_steps > 0 and parts.tasks.labelled_examples is not None
        cost = cost_line(
            options,
            parts.num_tasks,
            inner_steps=adaptation_steps(learner, options),
            scratch=fresh_model is not None and options.scratch_steps > 0,
            pretrained=classification and pretrains,
        )
        print(cost, file=sys.stderr, flush=True)
    with eval_threads():  # the pretraining too: small models run faster on one thread
        started = time.perf_counter()
        pretrained = None
        if classification:
            pretrained = pretrained_backbone(
                config, options, parts, build_fresh, progress, cache, shard
            )
            timings["pretrained embedding"] = time.perf_counter() - started
        started = time.perf_counter()
        batches: Any = parts.batches
        if shard.is_sharded:  # rank 0 draws them twice: to predict its share, to score all
            batches = Reiterable(lambda: parts.tasks.batches(options.batch_size, options.seed))
        scored = evaluate_tasks(
            learner,
            batches,
            options=options,
            # forecasts are scored in original units when the sampler names their store
            # columns; other tasks are scored as sampled
            store=store,
            target_columns=parts.target_columns,
            fresh_model=fresh_model,
            progress=progress,
            num_tasks=parts.num_tasks,
            pretrained=pretrained,
            cache=cache,
            windows=parts.windows,
            shard=shard,
            examples_normalised=parts.tasks.examples_normalised,
        )
    timings["scoring"] = time.perf_counter() - started
    return scored


def _fresh_model_builder(config: TrainConfig, parts: EvalParts) -> Callable[..., nn.Module]:
    """`build_fresh(output_shape=task output shape)`: a freshly initialised model of the
    run's architecture."""

    def build_fresh(output_shape: tuple[int, ...] = parts.task_output_shape) -> nn.Module:
        return build_model(
            config.model.name, parts.input_shape, output_shape, **config.model.options
        )

    return build_fresh


def load_trained(
    run_dir: Path,
    *,
    ensemble: Any = None,
    store: Any = None,
    allow_imports: Collection[str] = (),
    source: Any = None,
) -> tuple[Path, Any, nn.Module, Any, EvalOptions]:
    """`(run_dir, config, learner, task source, eval options)` of a run's checkpoint (the
    one model selection kept where there is one, else the latest),
    for adapting it to data of one's own (`metadist.load_run`).

    The learner (with the checkpoints of `ensemble`, default the run's `eval.ensemble`)
    is in eval mode; the store is opened without re-checksumming its values, but its
    identity must match the one the checkpoint recorded. A `source` given (the run's
    recorded parts, `metadist.train.artifact.recorded_source`, when its store is gone)
    replaces the store's; the caller then checks the ensemble members' stores.
    """
    config, state, _, _ = load_run(run_dir, "run_dir", store, allow_imports, use=USE)
    options = _run_eval_options(config, run_dir, (), None)
    if source is None:
        trained_on = (state.get("store_identity"), f"run_dir {run_dir}")
        source = build_task_source(config, verify_store=False, notes=False, trained_on=trained_on)
    learner, _ = with_ensemble(
        trained_learner(config, state, source, who=f"run_dir {run_dir}"),
        config,
        source,
        list(options.ensemble or []) if ensemble is None else list(ensemble),
        options.ensemble_reduce,
        store,
        use=USE,
        allow_imports=allow_imports,
    )
    learner.eval()
    return run_dir, config, learner, source, options


def _describe(
    result: dict[str, Any],
    config: TrainConfig,
    state: dict[str, Any],
    checkpoint_path: Path,
    pointer: dict[str, Any],
    tasks: str,
) -> None:
    """The result's title and what was evaluated (experiment, checkpoint, components)."""
    step = int(state.get("step", pointer.get("step", 0)))
    result["title"] = f"{config.experiment}: evaluation on held-out tasks after {step} meta-steps"
    result["settings"] = {
        "experiment": config.experiment,
        "checkpoint": describe_checkpoint(checkpoint_path, pointer),
        "learner": config.learner.name,
        "model": config.model.name,
        "tasks": tasks,
        **result["settings"],
    }


def _run_eval_options(
    config: Any, run_dir: Path, overrides: Iterable[str], config_dir: str | None
) -> EvalOptions:
    """The run's own evaluation settings (saved with its config); a run trained before
    runs kept them is evaluated with its experiment's eval file, and a note says which."""
    recorded = getattr(config, "eval", None)
    if recorded and isinstance(recorded.get("ensemble"), list):  # from the run, as trained
        members = members_from_run(run_dir, config.resolved_run_dir, recorded["ensemble"])
        recorded = {**recorded, "ensemble": members}
    if not recorded:
        path = eval_settings_file(config.experiment, config_dir)
        print(
            f"note: run_dir {run_dir} records no evaluation settings (trained before runs "
            f"kept them); using {path or 'the EvalOptions defaults (no eval file found)'}",
            file=sys.stderr,
        )
    return load_eval_options(config.experiment, overrides, config_dir, recorded=recorded)
