"""A sweep's settings and the plan of one trial (its overrides, seed, split and run dir)."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metadist.data.splits import split_protocol
from metadist.durable import atomic_write_json
from metadist.launch.slurm import LAUNCH_KEYS, job_from_settings, parse_settings
from metadist.launch.sweep.interpreter import check_slurm_python
from metadist.launch.sweep.space import SWEEP_OWNED_KEYS, ParamSpec, format_override
from metadist.train.build import build_task_source, check_components, learner_loss
from metadist.train.compose import find_experiments_dir, load_config
from metadist.train.selection import VAL_METRICS, SelectionConfig, check_val_metric

STUDY_FILE = "study.db"
STUDY_NAME = "metadist-sweep"
BEST_FILE = "best.yaml"
TABLE_FILE = "trials.md"
SPLIT_FILE = "split.json"
COMMAND_FILE = "command.json"
LOG_FILE = "train.log"
_MAX_OVERRIDE_CHARS = 100_000
_MAX_POLL_SECONDS = 86_400.0  # a day; `time.sleep` overflows on far larger values


@dataclass
class SweepSettings:
    """Everything a sweep needs besides the study.

    Attributes:
        overrides: Hydra overrides every trial gets (`experiment=NAME`, ...).
        space: the searched parameters.
        sweep_dir: where the study, the trials and the reports live.
        num_trials: trials to finish (completed or pruned) in the study.
        metric: key of the `split: val` records of `metrics.jsonl` to optimise.
        direction: `minimize` or `maximize`.
        base_seed: trial k gets `trainer.seed = base_seed + k`.
        test_seed: the seed whose meta-test split is pinned in every trial.
        launcher: `local` or `slurm`.
        nproc_per_node: training processes per trial (torchrun when > 1).
        parallel: trials running at once.
        pruner: `median` or `none`.
        startup_trials: trials finished before the pruner prunes anything.
        warmup_steps: steps of a trial before it can be pruned.
        sampler_seed: seed of Optuna's TPE sampler (reproducible suggestions).
        poll_seconds: how often a running trial's metrics are read.
        max_failures: stop after this many failed trials in one invocation.
        config_dir: experiments directory passed to the training.
        slurm_settings: `KEY=VALUE` launch settings of the Slurm jobs (see
            `metadist slurm submit`).
        python: interpreter running the trials (a Slurm trial's: `python=` of
            `slurm_settings` where given).
    """

    overrides: list[str]
    space: list[ParamSpec]
    sweep_dir: Path
    num_trials: int = 10
    metric: str = "loss"
    direction: str = "minimize"
    base_seed: int = 0
    test_seed: int = 0
    launcher: str = "local"
    nproc_per_node: int = 1
    parallel: int = 1
    pruner: str = "median"
    startup_trials: int = 2
    warmup_steps: int = 0
    sampler_seed: int = 0
    poll_seconds: float = 1.0
    max_failures: int = 3
    config_dir: str | None = None
    slurm_settings: list[str] = field(default_factory=list)
    python: str = field(default_factory=lambda: sys.executable)

    def validate(self) -> None:
        if self.num_trials < 1:
            raise ValueError(f"--trials must be >= 1, got {self.num_trials}")
        if self.direction not in ("minimize", "maximize"):
            raise ValueError(f"--direction must be minimize or maximize, got {self.direction!r}")
        _check_direction(self.metric, self.direction)
        if self.launcher not in ("local", "slurm"):
            raise ValueError(f"--launcher must be local or slurm, got {self.launcher!r}")
        if self.pruner not in ("median", "none"):
            raise ValueError(f"--pruner must be median or none, got {self.pruner!r}")
        for name in ("nproc_per_node", "parallel", "max_failures"):
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 1, got {getattr(self, name)}")
        for name in ("startup_trials", "warmup_steps"):
            if getattr(self, name) < 0:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.poll_seconds <= _MAX_POLL_SECONDS:  # NaN too; `sleep` refuses inf
            raise ValueError(
                f"--poll-seconds must be > 0 and <= {_MAX_POLL_SECONDS:g}, got {self.poll_seconds}"
            )
        if self.slurm_settings and self.launcher != "slurm":
            raise ValueError(
                f"--slurm {self.slurm_settings[0]}: Slurm settings apply to --launcher slurm, "
                f"not {self.launcher}"
            )
        if self.sweep_dir.exists() and not self.sweep_dir.is_dir():
            raise ValueError(f"--sweep-dir {self.sweep_dir} is a file, not a directory")
        if self.config_dir is not None:  # where it is, so a continued sweep finds it again
            self.config_dir = str(find_experiments_dir(self.config_dir).resolve())
        if self.base_seed < 0 or self.test_seed < 0:
            raise ValueError("--seed and --test-seed must be >= 0")
        if not any(t.partition("=")[0] == "experiment" for t in self.overrides):
            raise ValueError("experiment=NAME is required")
        # Training overrides among the launch settings would never reach the trials.
        _, stray = parse_settings(self.slurm_settings)
        if stray:
            raise ValueError(
                f"--slurm {stray[0]} is not a Slurm launch setting (one of "
                + ", ".join(LAUNCH_KEYS)
                + "); training overrides go after experiment=NAME"
            )
        check_slurm_python(self.slurm_settings)  # now, not once a wave left the queue
        searched = {p.name.lstrip("+") for p in self.space}
        for token in self.overrides:
            key, sep, _ = token.partition("=")
            if not sep:
                raise ValueError(f"expected a KEY=VALUE override, got {token!r}")
            key = key.lstrip("+~")
            if key in SWEEP_OWNED_KEYS:
                raise ValueError(f"{key} is set by the sweep for every trial; remove {token!r}")
            if key == "eval" or key.startswith("eval."):  # trials train with --no-eval
                raise ValueError(
                    f"{token}: a sweep's trials never evaluate the meta-test split, so eval "
                    "settings have no effect; evaluate the chosen settings afterwards "
                    "(metadist eval)"
                )
            if key in LAUNCH_KEYS:  # e.g. `--slurm nodes=2 gpus_per_node=4`
                raise ValueError(
                    f"{token} is a Slurm launch setting, not a training override: give it "
                    f"as --slurm {token}"
                )
            if key in searched:
                raise ValueError(f"{key} is both searched (--space) and fixed ({token!r})")


def _check_direction(metric: str, direction: str) -> None:
    """Refuses optimising a meta-val loss or accuracy the built-in learners log the wrong
    way (an accuracy minimised: the default direction): the best trial would be the worst.

    Raises:
        ValueError: naming the direction to give.
    """
    if metric not in VAL_METRICS or not ("loss" in metric or "accuracy" in metric):
        return  # a learner's own metric, or one with no better side by its name
    wanted = "maximize" if SelectionConfig().resolved_mode(metric) == "max" else "minimize"
    if direction != wanted:
        better = "higher" if wanted == "maximize" else "lower"
        raise ValueError(
            f"--metric {metric} is better {better}, but the sweep would {direction} it (the "
            f"best trial would be the worst); give --direction {wanted}"
        )


@dataclass
class TrialPlan:
    """How one trial runs: its overrides, seed, directory and length in meta-steps."""

    number: int
    seed: int
    params: dict[str, Any]
    run_dir: Path
    overrides: list[str]
    num_steps: int

    def train_command(self, settings: SweepSettings) -> list[str]:
        """The local command line of this trial's training."""
        head = [settings.python]
        if settings.nproc_per_node > 1:
            head += [
                "-m",
                "metadist.launch.torchrun",
                "--standalone",
                f"--nproc_per_node={settings.nproc_per_node}",
            ]
        tail = ["--config-dir", settings.config_dir] if settings.config_dir else []
        # a trial is scored on meta-val while it trains; its meta-test is never evaluated
        return [*head, "-m", "metadist.train", "--no-eval", *self.overrides, *tail]


def trial_config(settings: SweepSettings, seed: int, params: dict[str, Any]) -> tuple[list, Any]:
    """`(overrides, config)` of a trial with `params` and `seed`, composed and validated.

    Raises:
        ValueError: the composed config is invalid, or it has no meta-val evaluation
            (`trainer.eval_every` must be > 0 for a sweep).
    """
    param_overrides = [format_override(name, value) for name, value in params.items()]
    overrides = [*settings.overrides, *param_overrides, f"trainer.seed={seed}"]
    config = load_config(overrides, settings.config_dir, world_size=world_size(settings))
    check_components(config)  # their options, as the trial's training would read them
    _check_scored(config)
    return overrides, config


def _check_scored(config: Any) -> None:
    """Refuses a trial config without meta-val evaluation: nothing to score it on."""
    if config.trainer.eval_every <= 0:
        raise ValueError(
            "trainer.eval_every must be > 0 in a sweep: the trials are scored and pruned "
            "on their meta-val metric (add e.g. trainer.eval_every=50)"
        )


def check_space(settings: SweepSettings) -> None:
    """Composes a trial config for every categorical choice and for both bounds of every
    range (the other parameters at their first value), before the sweep creates anything.

    A misspelt `--metric` (`selection.check_val_metric`) and a typo in the space file (a
    key the config lacks, a group option that does not exist, a value the field refuses)
    are reported now, not as a failed trial in a study that
    would then refuse the corrected command.

    Raises:
        ValueError: naming the parameter and value whose config is refused.
    """
    try:  # --metric against the experiment's learner, before trial 0 runs
        base = load_config(settings.overrides, settings.config_dir, world_size=world_size(settings))
    except (ValueError, FileNotFoundError):
        base = None  # the overrides' mistake: named below, or by the first trial
    if base is not None:
        check_val_metric("--metric", settings.metric, base.learner.name, learner_loss(base))
        split = compute_split(base, settings.test_seed)
        if split["pins"]:
            pins_override(split)  # one a command line can carry, before the study is made
    first = {spec.name: spec.values()[0] for spec in settings.space}
    tried: set[str] = set()
    for spec in settings.space:
        for value in spec.values():
            params = {**first, spec.name: value}
            key = json.dumps(params, sort_keys=True, default=str)
            if key in tried:
                continue
            tried.add(key)
            try:
                trial_config(settings, settings.base_seed, params)
            except (ValueError, FileNotFoundError) as error:
                detail = " ".join(line.strip() for line in str(error).splitlines())
                if _base_refused(settings) == detail:  # the overrides' mistake, not the space's
                    raise ValueError(
                        f"the sweep's overrides give an invalid config: {detail}"
                    ) from None
                raise ValueError(
                    f"search space: {spec.name}={_shown(value)} gives an invalid trial "
                    f"config: {detail}"
                ) from None


def _base_refused(settings: SweepSettings) -> str | None:
    """What the base overrides alone are refused for (one line), or None."""
    try:
        config = load_config(
            settings.overrides, settings.config_dir, world_size=world_size(settings)
        )
        check_components(config)
        _check_scored(config)
    except (ValueError, FileNotFoundError) as error:
        return " ".join(line.strip() for line in str(error).splitlines())
    return None


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, tuple)) else str(value)


def decode_params(settings: SweepSettings, stored: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters as config values (Optuna keeps list choices as JSON text)."""
    return {
        spec.name: spec.decode(stored[spec.name]) for spec in settings.space if spec.name in stored
    }


def plan_trial(
    settings: SweepSettings,
    number: int,
    seed: int,
    params: dict[str, Any],
    run_dir: Path,
    wandb_name: str | None = None,
) -> TrialPlan:
    """The overrides of one trial, after checking that its configuration is valid.

    Composes the trial's config (base overrides + params), pins the meta-test units of
    `settings.test_seed`, and writes the trial's meta-train/val/test split to
    `<run_dir>/split.json`. The trial's wandb run is named `wandb_name` (default
    `trial-NNNN`) in the sweep's group (`wandb_group`) unless the overrides give one.

    Raises:
        ValueError: the composed config is invalid, or it has no meta-val evaluation
            (`trainer.eval_every` must be > 0 for a sweep).
    """
    base, config = trial_config(settings, seed, params)
    split = compute_split(config, settings.test_seed)
    overrides = list(base)
    if split["pins"]:
        overrides.append(pins_override(split))
    overrides += ["logging.progress=false", f"run_dir={run_dir}"]
    overrides.append(format_override("logging.wandb.name", wandb_name or f"trial-{number:04d}"))
    if not any(t.partition("=")[0].lstrip("+") == "logging.wandb.group" for t in base):
        overrides.append(format_override("logging.wandb.group", wandb_group(settings)))
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_json(run_dir / SPLIT_FILE, {"seed": seed, "test_seed": settings.test_seed, **split})
    plan = TrialPlan(number, seed, dict(params), run_dir, overrides, config.trainer.meta_steps)
    _write_json(run_dir / COMMAND_FILE, {"argv": plan.train_command(settings)})
    return plan


def wandb_group(settings: SweepSettings) -> str:
    """The wandb group of the sweep's trials: `sweep-<name of the sweep directory>`."""
    return f"sweep-{Path(settings.sweep_dir).resolve().name}"


def pins_override(split: dict[str, list[int]]) -> str:
    """The override pinning `split`'s meta-test units (`compute_split`).

    Raises:
        ValueError: one too long for a command line.
    """
    pins = "data.pinned_test_units=[" + ",".join(map(str, split["pins"])) + "]"
    if len(pins) > _MAX_OVERRIDE_CHARS:
        raise ValueError(
            f"the pinned meta-test split has {len(split['test'])} units, too many for a "
            "command line; set data.pinned_test_units in the experiment config instead"
        )
    return pins


def compute_split(config: Any, test_seed: int) -> dict[str, list[int]]:
    """Unit indices of meta-train/val/test for `config.trainer.seed`, test pinned.

    The test units are the meta-test split that `test_seed` gives (or the config's own
    `data.pinned_test_units`); train and val are split from the rest by the trial's seed,
    exactly as the training's partitioner does (`DataConfig.partitioner`). With a class
    split (`data.split_by=label|stratum`) the meta-test *classes* are pinned, and each
    trial deals the other classes to train and val by its own seed.

    Returns:
        `{"train", "val", "test": unit indices, "pins": the units to pin}`: with a class
        split one unit per meta-test class pins its whole class.
    """
    # The trials verify the store when they train; here only the split is computed.
    source = build_task_source(config, verify_store=False)
    store, sampler = source.store, source.sampler
    fractions = tuple(config.data.fractions)
    pins = config.data.pinned_test_units
    if pins is None and fractions[2] > 0:
        reference = config.data.partitioner(sampler, store, test_seed)
        pins = reference.units("test").tolist()
        entities = sampler.unit_entities()
        protocol = split_protocol(sampler, store, fractions, config.data.split_by)
        if protocol in ("label", "stratum"):
            # splitting by class needs a store and units that are its entities (build checks)
            assert store is not None and entities is not None
            codes = store.label_codes if protocol == "label" else store.stratum_codes
            classes = np.asarray(codes)[entities[pins]]
            _, first = np.unique(classes, return_index=True)
            pins = [pins[i] for i in sorted(first)]
    trial_config = copy.deepcopy(config.data)
    trial_config.pinned_test_units = pins
    trial = trial_config.partitioner(sampler, store, config.trainer.seed)
    split = {name: trial.units(name).tolist() for name in ("train", "val", "test")}
    split["pins"] = list(pins or [])
    return split


def world_size(settings: SweepSettings) -> int:
    if settings.launcher == "slurm":
        job, _ = job_from_settings(["experiment=x", *settings.slurm_settings], workdir="/")
        return job.nodes * job.processes_per_node
    return settings.nproc_per_node


def _write_json(path: Path, value: Any) -> None:
    atomic_write_json(path, value, indent=1)
