"""The meta-training loop: one forward and one backward per meta-step, under DDP.

`train(config)` is the whole run on one rank: build the parts, form the process group,
resume from the run directory's latest checkpoint if there is one (`metadist.train.resume`;
the random number generators' state: `metadist.train.rng`), loop, write the final
checkpoint. With meta-val evaluation on, each evaluation is compared with the best so far
(`metadist.train.selection`): the best is checkpointed as `checkpoints/best`, and
`selection.patience` evaluations without improvement stop the run early. Run it alone or under `torchrun`; every rank runs the same code, and only
rank 0 writes to the run directory.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from metadist.data import BatchMetaDataLoader
from metadist.diskspace import may_write
from metadist.runlock import RunLock
from metadist.store.format import is_store
from metadist.tasks.first_batch import check_batch_dtypes
from metadist.train.artifact import write_inference
from metadist.train.build import RunParts, build_parts, learner_loss
from metadist.train.checkpoint import checkpoint_dir, checkpoint_path, save_checkpoint
from metadist.train.config import TrainConfig, TrainerConfig
from metadist.train.distributed import (
    DistEnv,
    all_gather_objects,
    all_reduce_sum,
    barrier,
    destroy_distributed,
    init_distributed,
    read_env,
)
from metadist.train.finite import NonFiniteLossError, check_inputs_finite
from metadist.train.header import run_header
from metadist.train.log_sinks import check_log_sinks
from metadist.train.logging import NullLogger, RunLogger
from metadist.train.metrics_window import MetricsWindow
from metadist.train.optim import scheduled_lr
from metadist.train.pretrain_phase import check_pretraining, run_pretraining
from metadist.train.rank_errors import own_errors
from metadist.train.resume import check_same_run, finished_before, resume
from metadist.train.rng import rng_state
from metadist.train.selection import Selection, check_val_metric
from metadist.train.signals import StopRequest
from metadist.train.step import MetaStep, resolved_check_every

__all__ = [
    "NonFiniteLossError",
    "TrainResult",
    "check_same_run",  # re-exported: resuming lives in metadist.train.resume
    "evaluate",
    "finished_before",
    "train",
]


@dataclass
class TrainResult:
    """How a call to `train` ended.

    Attributes:
        step: meta-steps completed.
        run_dir: the run directory.
        checkpoint: the last checkpoint written (or resumed from), if any.
        stopped_by: the signal that stopped the run early (`"SIGTERM"`), else `None`.
        learner: this rank's learner (unwrapped), with the final parameters.
        loss: the last meta-loss (mean over all ranks' tasks).
        early_stopped: the run stopped before `trainer.meta_steps` because meta-val did
            not improve for `selection.patience` evaluations (now, or before a resume).
    """

    step: int
    run_dir: Path
    checkpoint: Path | None
    stopped_by: str | None
    learner: nn.Module
    loss: float
    early_stopped: bool = False


def train(
    config: TrainConfig,
    *,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainResult:
    """Meta-trains as `config` says, resuming from `run_dir`'s latest checkpoint.

    Args:
        config: a validated `TrainConfig` (`build_config` / `load_config`).
        on_eval: called on every rank with `(step, metrics)` after each meta-val
            evaluation (e.g. to report to a sweep); an exception from it stops the run.

    Raises:
        ValueError: a bad config (before any process group forms), a run directory
            holding a different experiment, or one another training writes to
            (`RunLockedError`, naming its pid and host).
        NonFiniteLossError: the meta-loss became NaN/inf; the last good checkpoint stays.
        CheckpointError: the latest checkpoint is truncated or foreign.
    """
    env = read_env(config.trainer.device, config.trainer.backend)
    config.validate(env.world_size)
    check_val_metric(
        "selection.metric", config.selection.metric, config.learner.name, learner_loss(config)
    )
    if is_store(config.resolved_run_dir):  # an ingest into the store would replace the run
        raise ValueError(
            f"run_dir {config.resolved_run_dir} is a series store; a run needs a directory "
            "of its own, e.g. run_dir=runs/NAME"
        )
    check_log_sinks(config.resolved_run_dir, config.logging)  # before anything is built
    threads_before = torch.get_num_threads()
    if config.trainer.num_threads is not None:
        torch.set_num_threads(config.trainer.num_threads)
    try:
        parts = build_parts(config, env)  # a bad component is refused before any file
        check_pretraining(config, parts)
        # One writer per run directory: rank 0 holds the lock for the whole run.
        with RunLock(config.resolved_run_dir) if env.is_main else contextlib.nullcontext():
            return _train_parts(config, env, parts, on_eval)
    finally:
        torch.set_num_threads(threads_before)


def _train_parts(
    config: TrainConfig,
    env: DistEnv,
    parts: RunParts,
    on_eval: Callable[[int, dict[str, float]], None] | None,
) -> TrainResult:
    formed = not torch.distributed.is_initialized()
    init_distributed(env)
    try:
        result = _run(config, env, parts, on_eval)
        if formed:
            # Every rank leaves together: a rank that tears its process group down
            # while another still writes the last checkpoint can abort at exit (gloo).
            _leave_together(env, stopped=result.stopped_by is not None)
        return result
    finally:
        if formed:
            # The DDP wrapper of `_run` lives on in reference cycles, holding the process
            # group: collected at interpreter exit instead, gloo's threads can touch Python
            # objects while it shuts down and abort the rank ("terminate called without an
            # active exception"). Collect it while the interpreter is whole.
            gc.collect()
            destroy_distributed()


def _leave_together(env: DistEnv, stopped: bool = False) -> None:
    """The last barrier of a run. Each rank first records in the group's store that it
    finished (its checkpoint written); a barrier that fails on a lost connection once
    every rank has recorded it (a peer past the barrier closed its connection before
    this rank read the last message) loses nothing and is not a failure. So it is after
    a stop every rank agreed on (`stopped`: the stop signal's step, checkpointed), where
    the launcher holding the store may itself be stopping: a peer that failed in it is
    reported by the launcher. Any other failure, or one before every rank finished (a
    peer crashed), raises."""
    store = _group_store()
    key = f"metadist/finished/{env.rank}"
    if store is not None:
        store.set(key, "1")
    try:
        barrier(env)
    except RuntimeError as error:  # gloo's DistBackendError is one
        lost = "connection" in str(error).lower()
        if not lost or not (stopped or _all_finished(store, env)):
            raise


def _group_store():
    """The default process group's store, or `None` where there is none to reach."""
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def _all_finished(store, env: DistEnv) -> bool:
    """Whether every rank recorded in `store` that it finished (`False` where the store
    cannot be read: its host, rank 0, may be the peer that ended)."""
    if store is None:
        return False
    try:
        return bool(store.check([f"metadist/finished/{r}" for r in range(env.world_size)]))
    except RuntimeError:
        return False


@dataclass
class _Context:
    """What the loop works with besides its own position."""

    config: TrainConfig
    env: DistEnv
    parts: RunParts
    model: nn.Module  # the learner, wrapped in DDP when there are several ranks
    logger: RunLogger | NullLogger
    stop: StopRequest
    run_id: str
    on_eval: Callable[[int, dict[str, float]], None] | None
    selection: Selection | None  # None without meta-val evaluation


def _run(config: TrainConfig, env: DistEnv, parts: RunParts, on_eval) -> TrainResult:
    step, run_id, checkpoint, metrics_window, selected = resume(config, env, parts)
    if env.is_main:  # what inference needs, kept with the run (also if it is cut short)
        write_inference(config.resolved_run_dir, config, parts)
    if env.is_main:
        logger: RunLogger | NullLogger = RunLogger(
            config.resolved_run_dir,
            config.logging,
            experiment=config.experiment,
            run_id=run_id,
            start_step=step,
            total_steps=config.trainer.meta_steps,
            run_config=config.to_dict(),
        )
    else:
        logger = NullLogger()
    # closed whatever stops the run from here on (pre-training's error, Ctrl-C): an open
    # wandb run would take the next wandb.log of the process (metadist.fit's caller)
    try:
        logger.message(run_header(config, env, parts))
        if checkpoint is not None:
            logger.message(f"resumed from {checkpoint} at step {step}")
            if step >= config.trainer.meta_steps:
                logger.message(
                    f"run_dir {config.resolved_run_dir} already holds {step} meta-steps, not fewer "
                    f"than trainer.meta_steps={config.trainer.meta_steps}: nothing to train; raise "
                    "trainer.meta_steps to continue it, or choose another run_dir for a new run"
                )
        if checkpoint is None:  # a fresh run: its pre-training phase first (if it has one)
            run_pretraining(config, env, parts, logger.message)
        selection = None
        if parts.val_loader is not None:
            # the same tasks at every evaluation (`evaluate`): as many as its batches give
            val_tasks = min(config.trainer.eval_batches, len(parts.val_loader))
            selection = Selection(
                config.selection, parts.learner.loss, val_tasks * parts.val_loader.tasks_per_step
            )
            note = selection.restore(selected)
            if note is not None:
                logger.message(note)
        elif config.selection.patience is not None and config.trainer.eval_every <= 0:
            logger.message(
                f"note: selection.patience={config.selection.patience} does not apply: "
                "trainer.eval_every=0 evaluates no meta-val"
            )
        model: nn.Module = parts.learner
        if env.is_distributed:
            model = DistributedDataParallel(
                parts.learner,
                device_ids=[env.device] if env.device.type == "cuda" else None,
                find_unused_parameters=config.trainer.find_unused_parameters,
            )
        with StopRequest() as stop, own_errors(env):  # a rank's own error: it says so
            context = _Context(config, env, parts, model, logger, stop, run_id, on_eval, selection)
            if checkpoint is None and config.pretrain.steps > 0 and selection is not None:
                checkpoint = _select_pretrained(context)
            return _loop(context, step, checkpoint, metrics_window)
    finally:
        for loader in (parts.train_loader, parts.val_loader):
            if loader is not None:
                loader.close()  # persistent workers stop now, not at a later collection
        logger.close()


def _loop(
    ctx: _Context, step: int, checkpoint: Path | None, metrics_window: dict[str, Any] | None
) -> TrainResult:
    """Meta-steps from `step` to `trainer.meta_steps`, epoch after epoch of the loader.

    The host reads the step guard (`metadist.train.step`) every `trainer.check_every`
    steps and before every metrics record, evaluation and checkpoint.
    """
    trainer, env, parts = ctx.config.trainer, ctx.env, ctx.parts
    val_loader, tasks = parts.val_loader, parts.train_loader.tasks_per_step
    val_start = val_loader.state_dict() if val_loader is not None else {}
    check_every = resolved_check_every(trainer.check_every, env.device)
    meta_step = _meta_step(ctx, check_every)
    window = MetricsWindow(step)
    if metrics_window is not None:  # the record under way when the checkpoint was saved
        window.restore(metrics_window)
    loss = float("nan")
    selection = ctx.selection
    if selection is not None and selection.exhausted and step < trainer.meta_steps:
        ctx.logger.message(
            f"{selection.stop_message(step)}; nothing to train (raise "
            "selection.patience, or set it to null, to go on)"
        )
        return _result(ctx, step, checkpoint, None, loss, early_stopped=True)
    while step < trainer.meta_steps:
        for batch in parts.train_loader:
            check_batch_dtypes(batch, ctx.config.sampler.name, f"at meta-step {step + 1}")
            batch = batch.to(env.device, non_blocking=True)
            done = step + 1
            last = done == trainer.meta_steps
            logs = done % ctx.config.logging.log_every == 0 or last
            evals = val_loader is not None and (done % trainer.eval_every == 0 or last)
            saves = done % trainer.checkpoint_every == 0 or last
            sync = done % check_every == 0 or logs or evals or saves
            lr = scheduled_lr(ctx.config.optimizer, step, trainer.meta_steps)
            reading = meta_step(batch, step, lr, sync=sync)
            if reading is not None and reading.bad_step is not None:
                if reading.bad_step == done:  # this batch: blame its data if it is at fault
                    check_inputs_finite(batch, parts.sampler, step, env)
                raise NonFiniteLossError(
                    f"the meta-loss is not finite at step {reading.bad_step} (on at least one "
                    "rank); the step was not applied. Last good checkpoint: "
                    f"{checkpoint or 'none yet'}. Lower optimizer.lr or "
                    "the learner's inner_lr, or set optimizer.grad_clip."
                )
            step = done
            if reading is None:
                continue
            loss, stopping = reading.loss, reading.stop
            window.add(reading.sums, reading.num_steps)
            ctx.logger.progress(step, loss, window.tasks_per_s(step, tasks))
            if logs:
                values = window.flush(step, tasks)
                values["lr"] = parts.optimizer.param_groups[0]["lr"]
                ctx.logger.log(step, "train", values)
            improved = early = False
            if evals and val_loader is not None:
                improved, early = _validate(ctx, step, val_loader, val_start, last)
            if saves or stopping or improved or early:
                checkpoint = _save(ctx, step, window, best=improved)
            if stopping:
                ctx.logger.message(
                    f"{ctx.stop.signal_name or 'another rank was signalled'}: checkpoint of "
                    f"step {step} written to {checkpoint}; exiting"
                )
                return _result(ctx, step, checkpoint, ctx.stop.signal_name or "peer", loss)
            if early:
                assert selection is not None  # only a selection stops early
                ctx.logger.message(f"{selection.stop_message(step)}; checkpoint {checkpoint}")
                return _result(ctx, step, checkpoint, None, loss, early_stopped=True)
            if last:
                break
    ctx.logger.message(f"finished {step} meta-steps; checkpoint {checkpoint}")
    return _result(ctx, step, checkpoint, None, loss)


def _meta_step(ctx: _Context, check_every: int) -> MetaStep:
    """The run's `MetaStep` (forward, backward and update of one meta-batch)."""
    trainer = ctx.config.trainer
    return MetaStep(
        ctx.model,
        ctx.parts.learner,
        ctx.parts.optimizer,
        ctx.env,
        check_every=check_every,
        grad_clip=ctx.config.optimizer.grad_clip,
        compile=trainer.compile,
        precision=trainer.precision,
        stop_requested=lambda: ctx.stop.requested,
        message=ctx.logger.message,
    )


def _validate(
    ctx: _Context,
    step: int,
    val_loader: BatchMetaDataLoader,
    val_start: dict[str, Any],
    last: bool,
) -> tuple[bool, bool]:
    """Evaluates meta-val at `step`, logs it, counts it in the run's selection and reports
    it (`on_eval`): (whether it is the best so far, whether the run stops early here:
    patience used up before the last step)."""
    values = evaluate(ctx.parts.learner, val_loader, val_start, ctx.env, ctx.config.trainer)
    ctx.logger.log(step, "val", values)
    improved = early = False
    if ctx.selection is not None:
        name = checkpoint_path(ctx.config.resolved_run_dir, step).name
        improved = ctx.selection.update(step, values, name)
        early = ctx.selection.exhausted and not last
    if ctx.on_eval is not None:
        ctx.on_eval(step, values)
    return improved, early


def _select_pretrained(ctx: _Context) -> Path | None:
    """Meta-val of the model right after pre-training (step 0), a candidate of the
    selection like every later evaluation: where meta-training never beats it on meta-val,
    the pretrained model is what the run keeps (Meta-Baseline selects so). Returns its
    checkpoint where it is the best so far (the first evaluation always is)."""
    val_loader = ctx.parts.val_loader
    assert val_loader is not None  # a selection exists only with meta-val
    start = val_loader.state_dict()
    improved, _ = _validate(ctx, 0, val_loader, start, last=False)
    val_loader.load_state_dict(start)  # later evaluations start from the same episodes
    return _save(ctx, 0, MetricsWindow(0), best=True) if improved else None


def _result(
    ctx: _Context,
    step: int,
    checkpoint: Path | None,
    stopped_by: str | None,
    loss: float,
    *,
    early_stopped: bool = False,
) -> TrainResult:
    return TrainResult(
        step,
        ctx.config.resolved_run_dir,
        checkpoint,
        stopped_by,
        ctx.parts.learner,
        loss,
        early_stopped=early_stopped,
    )


def evaluate(
    learner: nn.Module,
    loader: BatchMetaDataLoader,
    start_state: dict[str, Any],
    env: DistEnv,
    trainer: TrainerConfig,
) -> dict[str, float]:
    """Mean meta-loss and metrics on the same `eval_batches` meta-val batches every time.

    Runs the unwrapped learner (no gradient all-reduce); the results are averaged over
    all ranks' tasks. Collective: every rank must call it at the same step.
    """
    loader.load_state_dict(start_state)
    sums: dict[str, torch.Tensor] = {}
    num_batches = 0
    for batch in loader:
        check_batch_dtypes(batch, loader.sampler.name, "in meta-val")
        output = learner(batch.to(env.device, non_blocking=True))
        values = {"loss": output.loss, **output.metrics}
        for name, value in values.items():
            value = value.detach().to(torch.float64)
            sums[name] = sums[name] + value if name in sums else value
        num_batches += 1
        if num_batches == trainer.eval_batches:
            break
    names = sorted(sums)
    # On the rank's device: NCCL reduces GPU tensors only. One transfer to the host.
    local = torch.stack([sums[n].reshape(()) for n in names])
    count = torch.tensor([float(num_batches)], dtype=torch.float64, device=local.device)
    totals = all_reduce_sum(torch.cat([local, count]), env).tolist()
    return {n: v / totals[-1] for n, v in zip(names, totals[:-1], strict=True)}


def _save(ctx: _Context, step: int, window: MetricsWindow, *, best: bool = False) -> Path:
    """Checkpoint of `step` (collective: gathers every rank's RNG state; rank 0 writes),
    with the run's selection record; `best`: it is the best on meta-val so far, and
    `checkpoints/best` moves to it.

    Returns the checkpoint's path on every rank.
    """
    config, env, parts = ctx.config, ctx.env, ctx.parts
    rng_states = all_gather_objects(rng_state(env), env)
    if not env.is_main:
        return checkpoint_path(config.resolved_run_dir, step)
    state = {
        "learner": parts.learner.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "loader": parts.train_loader.state_dict(),
        "rng": rng_states,
        "world_size": env.world_size,
        "run_id": ctx.run_id,
        "config": config.to_dict(),
        "store_identity": parts.store_identity,
        "metrics_window": window.state(),
        "selection": ctx.selection.state() if ctx.selection is not None else None,
    }
    record = ctx.selection.record() if best and ctx.selection is not None else None
    directory = checkpoint_dir(config.resolved_run_dir)
    with may_write(directory, f"the checkpoint of step {step}"):  # `latest` stays whole
        return save_checkpoint(
            config.resolved_run_dir, step, state, keep=config.trainer.keep_checkpoints, best=record
        )
