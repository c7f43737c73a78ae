"""`metadist.fit(...)`: `metadist train` from Python, returning the trained `Run`.

    import metadist

    run = metadist.fit("synthetic_maml", ["data.store=store", "trainer.meta_steps=500"],
                       run_dir="runs/demo")
    forecasts = run.forecast(history)

Training runs in this process on one rank (`metadist.train.train`), then, as
`metadist train` does, the run is evaluated on its held-out tasks; calling `fit` again
with the same arguments resumes the run from its latest checkpoint.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from metadist.api.arguments import run_path
from metadist.api.run import Run, load_run
from metadist.diskspace import OutOfSpaceError
from metadist.eval import EvalOptions, evaluate_run
from metadist.eval.report import markdown_report
from metadist.eval.settings import check_periods_cover
from metadist.store import SeriesStore
from metadist.train.compose import compose_dict
from metadist.train.config import TrainConfig, build_config
from metadist.train.loop import train


def fit(
    experiment: str | None = None,
    overrides: Sequence[str] = (),
    *,
    config: TrainConfig | Mapping[str, Any] | None = None,
    run_dir: str | os.PathLike | None = None,
    config_dir: str | os.PathLike | None = None,
    evaluate: bool = True,
    progress: bool | None = None,
) -> Run:
    """Meta-trains an experiment in this process, evaluates it, and returns the run.

    Args:
        experiment: the experiment's name (`experiment=NAME` of `metadist train`), e.g.
            `"synthetic_maml"`.
        overrides: Hydra overrides as `metadist train` takes them, e.g.
            `["data.store=store", "trainer.meta_steps=500", "learner=metasgd"]`;
            `eval.KEY=VALUE` ones set the evaluation (kept with the run: `Run.eval_options`).
        config: instead of `experiment` and `overrides`, a whole config: a `TrainConfig`
            (`metadist.train.load_config`) or its nested dict (`TrainConfig.to_dict()`).
        run_dir: the run directory (default: the config's, else `runs/<experiment>` as
            `metadist train` names it). A run directory holding a checkpoint of the same
            experiment is resumed.
        config_dir: the experiments directory (default: as `metadist train` finds it).
        evaluate: evaluate the finished run on its held-out tasks, as `metadist train`
            does unless `--no-eval`: the report is printed and written to
            `<run_dir>/eval/` (a failed evaluation is a warning, not an error).
        progress: show training's and the evaluation's progress (default: the config's
            `logging.progress` for training; bars on a terminal for the evaluation).

    Returns:
        The trained run, as `metadist.load_run(run_dir)` returns it.

    Raises:
        ValueError: a bad argument, override, field or value, naming it; a run directory
            of another experiment or in use by another training.
        FileNotFoundError: no experiments directory, or `data.store` missing.
        NonFiniteLossError: the meta-loss became NaN/inf (the last good checkpoint stays).
        CheckpointError: the run directory's latest checkpoint is damaged.
        KeyboardInterrupt: training was interrupted; its checkpoint is written and the same
            call resumes it.
    """
    for name, path in (("run_dir", run_dir), ("config_dir", config_dir)):
        if path is not None:
            run_path(name, path)
    if not isinstance(evaluate, bool):
        raise ValueError(f"evaluate must be True or False, not {evaluate!r}")
    values = _composed(experiment, overrides, config, config_dir)
    if run_dir is not None:
        values["run_dir"] = os.fspath(run_dir)
    if progress is not None:
        if not isinstance(progress, bool):
            raise ValueError(f"progress must be True, False or None, not {progress!r}")
        values.setdefault("logging", {})["progress"] = progress
    train_config = build_config(values)
    eval_options = EvalOptions.from_dict(train_config.eval) if evaluate else None
    if eval_options is not None and train_config.data.store:
        check_periods_cover(eval_options, SeriesStore.open(train_config.data.store))
    result = train(train_config)  # bad eval settings failed above, before any training
    if result.stopped_by is not None:
        raise KeyboardInterrupt(
            f"training stopped by {result.stopped_by}; checkpoint of step {result.step} "
            f"written to {result.checkpoint}; call fit again with the same arguments to resume"
        )
    if eval_options is not None:
        _evaluate(result.run_dir, eval_options, config_dir, progress)
    return load_run(result.run_dir)


def _composed(
    experiment: str | None,
    overrides: Sequence[str],
    config: TrainConfig | Mapping[str, Any] | None,
    config_dir: str | os.PathLike | None,
) -> dict[str, Any]:
    """The config as a nested dict, from `config` or from the experiment and overrides.

    Raises:
        ValueError: both or a wrongly typed argument, naming it; a bad override.
    """
    if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(f"overrides must be a list of 'key=value' strings, not {overrides!r}")
    if experiment is not None and not isinstance(experiment, str):
        raise ValueError(f"experiment must be an experiment's name, not {experiment!r}")
    if config is None:
        chosen = [f"experiment={experiment}"] if experiment is not None else []
        return compose_dict([*chosen, *overrides], config_dir)
    if experiment is not None or overrides:
        raise ValueError("config: give either config or experiment and overrides, not both")
    if isinstance(config, TrainConfig):
        return config.to_dict()
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise ValueError(f"config must be a TrainConfig or a dict of its sections, not {config!r}")


def _evaluate(
    run_dir: os.PathLike,
    options: EvalOptions,
    config_dir: str | os.PathLike | None,
    progress: bool | None,
) -> None:
    """Evaluates the finished run as `metadist train` does at its end: prints the report."""
    try:
        result = evaluate_run(
            run_dir,
            options=options,
            config_dir=None if config_dir is None else os.fspath(config_dir),
            progress=progress,
        )
    except (ValueError, FileNotFoundError, OutOfSpaceError) as error:
        warnings.warn(f"evaluation skipped: {error}", stacklevel=3)
        return
    print(markdown_report(result), end="")
