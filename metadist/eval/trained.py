"""A run's meta-trained learner, rebuilt from its checkpoint (and its ensemble's).

`load_run` reads a run directory's config and its best checkpoint on meta-val (where
model selection kept one, `checkpoints/best`), else its latest; `trained_learner` builds
the run's model and learner with the checkpoint's weights on the evaluation device;
`with_ensemble` joins the latest checkpoints of other runs of the same data and sampler
to it (`LearnerEnsemble`, `eval.ensemble`).
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from metadist.eval.member_split import check_member_held_out
from metadist.learners import build_learner
from metadist.learners.ensemble import LearnerEnsemble
from metadist.models import build_model
from metadist.store import SeriesStore
from metadist.store.format import is_store
from metadist.store.identity import check_store_identity
from metadist.tasks import get_task_sampler
from metadist.train import distributed
from metadist.train.checkpoint import LATEST, checkpoint_dir, load_checkpoint, selected_checkpoint
from metadist.train.checkpoint_use import EVALUATION, CheckpointUse
from metadist.train.config import TrainConfig, build_config, without_nulls


class ModelShapes(Protocol):
    """What a run's learner is rebuilt for: its store and its model's shapes (an
    `EvalParts`, or a `metadist.train.build.TaskSource`)."""

    @property
    def store(self) -> Any: ...

    @property
    def input_shape(self) -> tuple[int, ...]: ...

    @property
    def output_shape(self) -> tuple[int, ...]: ...


def load_run(
    run_dir: Path,
    field: str,
    store: Any = None,
    allow_imports: Collection[str] = (),
    checkpoint: str = "best",
    use: CheckpointUse = EVALUATION,
) -> tuple[TrainConfig, dict[str, Any], Path, dict[str, Any]]:
    """(config, checkpoint state, checkpoint path, pointer) of a run's best checkpoint on
    meta-val where it has one, else its latest (`checkpoint="latest"`: the latest);
    `store` replaces the config's `data.store` (a store that moved since training). The
    run's `imports` are imported only if in `allow_imports` or already imported. `use`
    (who reads the run) words the remedies of a damaged or missing checkpoint.

    Raises:
        FileNotFoundError: no directory at `run_dir` (named as `field`), or no checkpoint.
    """
    if not run_dir.is_dir():
        raise FileNotFoundError(_no_run_directory(run_dir, field))
    found = selected_checkpoint(run_dir, checkpoint, use)
    if found is None:
        raise _no_checkpoint_error(run_dir, use)
    checkpoint_path, pointer = found
    state = load_checkpoint(checkpoint_path, pointer, use)
    if store is not None:
        saved = state["config"]
        state["trained_store"] = saved.get("data", {}).get("store")  # for messages
        state["config"] = {**saved, "data": {**saved.get("data", {}), "store": str(store)}}
    config = build_config(state["config"], world_size=1, allow_imports=allow_imports)
    return config, state, checkpoint_path, pointer


def _no_run_directory(run_dir: Path, field: str) -> str:
    """Why `run_dir` is no run directory: nothing there, a packed run (a tar or zip
    archive, shared so: unpacked first) or another file."""
    if not run_dir.is_file():
        return f"{field}: no run directory at {run_dir}"
    if tarfile.is_tarfile(run_dir) or zipfile.is_zipfile(run_dir):
        return (
            f"{field}: {run_dir} is an archive, not a run directory: unpack it (tar xf, "
            "unzip) and give the run directory inside"
        )
    return f"{field}: {run_dir} is a file, not a run directory"


def _no_checkpoint_error(run_dir: Path, use: CheckpointUse) -> FileNotFoundError:
    """The error for a run_dir without a checkpoint, pointing at run directories inside it."""
    if is_store(run_dir):
        return FileNotFoundError(
            f"run_dir {run_dir} is a series store, not a run: give the run directory a "
            "training wrote (its run_dir=...)"
        )
    inside = sorted(
        sub
        for sub in run_dir.iterdir()
        if sub.is_dir() and (checkpoint_dir(sub) / LATEST).is_file()
    )
    if inside:
        runs = ", ".join(f"run_dir={sub}" for sub in inside)
        return FileNotFoundError(
            f"run_dir {run_dir} has no checkpoint, but it contains a run that has: "
            f"{use.verb} that instead ({runs})"
        )
    return FileNotFoundError(
        f"run_dir {run_dir} has no checkpoint yet; train first "
        f"(metadist train experiment=NAME run_dir={run_dir})"
    )


def trained_learner(
    config: TrainConfig,
    state: dict[str, Any],
    parts: ModelShapes,
    input_shape: tuple[int, ...] | None = None,
    member: str = "",
    who: str = "the run",
) -> nn.Module:
    """The run's learner with the checkpoint's weights (its model taking `input_shape`,
    default the evaluated tasks' input shape), on the evaluation device.

    Args:
        member: an ensemble member's run directory, for the error ("": the evaluated run).
        who: the run named in an error of weights that do not fit.

    Raises:
        ValueError: an ensemble member whose weights do not fit the evaluated run's
            outputs (another embedding size, or a row per way against an embedding);
            weights that do not fit the model built for the tasks' shapes (the
            sampler's windows changed since training), naming `who` and the first
            parameter that differs.
    """
    torch.manual_seed(config.trainer.seed)
    shape = input_shape or parts.input_shape
    model = build_model(config.model.name, shape, parts.output_shape, **config.model.options)
    learner = build_learner(config.learner.name, model, **config.learner.options)
    if member:
        _check_member_shapes(learner, state["learner"], member, parts.output_shape)
    try:
        learner.load_state_dict(state["learner"])
    except RuntimeError as error:  # torch's many-line "Error(s) in loading state_dict"
        lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        first = (lines[0] if lines else str(error)).rstrip(".")
        raise ValueError(
            f"{who}: its checkpoint's weights do not fit the model built for its tasks "
            f"(inputs {list(shape)}, outputs {list(parts.output_shape)}): {first}; its "
            "sampler cuts other windows than in training (a sampler of your own changed "
            "since, or the run's record of its shapes was edited)"
        ) from None
    # Looked up on the module, so that tests can move evaluation to another device.
    return learner.to(distributed.evaluation_device(config.trainer.device))


def _check_member_shapes(
    learner: nn.Module, weights: dict[str, Any], member: str, output_shape: tuple[int, ...]
) -> None:
    """Refuses, in one line, a member whose checkpoint holds a weight of another shape
    than its learner built for the evaluated run's outputs `output_shape`."""
    built = learner.state_dict()
    for name, value in weights.items():
        if name in built and tuple(built[name].shape) != tuple(value.shape):
            raise ValueError(
                f"eval.ensemble: {member} does not give the evaluated run's outputs: its "
                f"{name} is {list(value.shape)}, where outputs of shape {list(output_shape)} "
                f"need {list(built[name].shape)} (a prototype learner's embedding of "
                "model.output_shape, or a row per way); members must give outputs of one shape"
            )


def with_ensemble(
    learner: nn.Module,
    config: TrainConfig,
    parts: ModelShapes,
    member_dirs: list[str],
    reduce: str,
    store: Any = None,
    held_out: np.ndarray | None = None,
    use: CheckpointUse = EVALUATION,
    allow_imports: Collection[str] = (),
) -> tuple[nn.Module, list[str]]:
    """`learner` joined by the latest checkpoints of the runs `member_dirs` in a
    `LearnerEnsemble` (`reduce`: mean or median), and `"<member_dir> (<checkpoint>)"` of
    each member; `learner` itself and `[]` without members. `store` as in `load_run`;
    `held_out`: the evaluated split's units (`EvalParts.held_out`), which no member may
    have trained on (`None`: nothing is evaluated, or every unit is). `use` and
    `allow_imports` (the modules a member's `imports` may import) as in `load_run`.

    Raises:
        ValueError: a member trained on other data or tasks (`ensemble_member`), or on
            units of the evaluated split (`member_split.check_member_held_out`).
    """
    if not member_dirs:
        return learner, []
    learners: list[Any] = [learner]
    lookbacks: list[int | None] = [None]
    names = []
    for member_dir in member_dirs:
        member, name, lookback = ensemble_member(
            Path(member_dir), config, parts, store, held_out, use, allow_imports
        )
        learners.append(member)
        lookbacks.append(lookback)
        names.append(f"{member_dir} ({name})")
    return LearnerEnsemble(learners, reduce=reduce, lookbacks=lookbacks), names


def ensemble_member(
    run_dir: Path,
    config: TrainConfig,
    parts: ModelShapes,
    store: Any = None,
    held_out: np.ndarray | None = None,
    use: CheckpointUse = EVALUATION,
    allow_imports: Collection[str] = (),
) -> tuple[nn.Module, str, int | None]:
    """(learner, checkpoint name, lookback or None) of the ensemble member `run_dir`.

    It must have been trained on the evaluated run's store with the same sampler, up to
    a lookback no longer than the evaluated run's, so that it can forecast its tasks.
    `store` (a store that moved since training) replaces the member's `data.store` too;
    the store's recorded identity is still checked, and (given `held_out`) that its own
    split kept the evaluated units out of its training.
    """
    member, state, checkpoint_path, _ = load_run(
        run_dir, "eval.ensemble", store, allow_imports, use=use
    )
    if member.sampler.name != config.sampler.name:  # before its options are compared
        raise ValueError(
            f"eval.ensemble: {run_dir} is a run of another kind (sampler "
            f"{member.sampler.name!r}, the evaluated run's {config.sampler.name!r}); "
            "members must see the same tasks"
        )
    mine, theirs, lookback = _sampler_options(run_dir, member, config)
    for setting, a, b in (
        ("data.store", member.data.store, config.data.store),
        ("sampler.options", mine, theirs),
    ):
        if a != b:
            raise ValueError(
                f"eval.ensemble: {run_dir} was trained with {setting}={a!r}, the evaluated "
                f"run with {b!r}; members must see the same tasks"
            )
    # a store the run recorded (`load_run` of a run whose store is gone) holds no data to
    # check: `api.artifact` compares the members' recorded identities instead
    if isinstance(parts.store, SeriesStore):
        try:
            check_store_identity(
                state.get("store_identity"), parts.store, f"eval.ensemble member {run_dir}"
            )
        except ValueError:  # the member's store, not the evaluated run's, is the odd one
            trained = state.get("trained_store", member.data.store)
            raise ValueError(
                f"eval.ensemble: {run_dir} was trained on another store than the evaluated "
                f"run's ({config.data.store!r}; the member's data.store was {trained!r}, "
                "whose data have changed since if it is the same path); members must see "
                "the same tasks"
            ) from None
    trained = state.get("trained_store", member.data.store)
    evaluated = config.data.store
    unrecorded = state.get("store_identity") is None and trained and evaluated
    if unrecorded and Path(str(trained)).resolve() != Path(str(evaluated)).resolve():
        raise ValueError(
            f"eval.ensemble: {run_dir} was trained with data.store={trained!r}, the "
            f"evaluated run with {config.data.store!r}; members must see the same tasks"
        )
    check_member_held_out(run_dir, member, held_out)
    input_shape = None if lookback is None else (lookback, *parts.input_shape[1:])
    learner = trained_learner(
        member, state, parts, input_shape, member=str(run_dir),
        who=f"eval.ensemble member {run_dir}",
    )  # fmt: skip
    return learner, checkpoint_path.name, lookback


def _sampler_options(
    run_dir: Path, member: TrainConfig, config: TrainConfig
) -> tuple[dict[str, Any], dict[str, Any], int | None]:
    """(member's, evaluated run's) sampler options to compare, without the training-only
    ones (nor the lookback, where the member may look back less), and the member's
    lookback where it is shorter (else None).

    Raises:
        ValueError: the member looks back further than the evaluated run.
    """
    mine = without_nulls(dict(member.sampler.options))
    theirs = without_nulls(dict(config.sampler.options))
    sampler_class = get_task_sampler(config.sampler.name)
    for key in sampler_class.training_only_options:
        mine.pop(key, None)
        theirs.pop(key, None)
    if not sampler_class.ensemble_may_shorten_lookback or mine.get("lookback") == theirs.get(
        "lookback"
    ):
        return mine, theirs, None
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
    return mine, theirs, lookback
