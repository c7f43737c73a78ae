"""Hyper-parameter sweeps: an Optuna study whose trials are separate training runs.

`metadist sweep experiment=NAME [overrides] --trials N --space FILE [--sweep-dir DIR]
[--launcher local|slurm]` keeps the study in `<sweep_dir>/study.db` (SQLite; running the
same command again continues it) and runs every trial as its own `metadist.train` run in
`<sweep_dir>/trials/NNNN/`:

- each trial has its own seed (`trainer.seed`), hence its own stratified meta-train /
  meta-val split, while the meta-test split is pinned to the one of `--test-seed` in every
  trial (`data.pinned_test_units`), so no trial ever trains or validates on test units;
- the validation metric is read back from the run's `metrics.jsonl` while it trains and
  reported to Optuna, whose pruner can stop a poor trial early (its processes are
  signalled to checkpoint and exit);
- `best.yaml` (the best configuration as overrides) and `trials.md` (a table of every
  trial) are rewritten after each trial.

Local trials run as subprocesses (under torchrun with `--nproc-per-node` > 1); Slurm trials
run as elements of an array job, one element per trial.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STUDY_FILE = "study.db"
STUDY_NAME = "metadist-sweep"
BEST_FILE = "best.yaml"
TABLE_FILE = "trials.md"
SPLIT_FILE = "split.json"
COMMAND_FILE = "command.json"
LOG_FILE = "train.log"
_MAX_OVERRIDE_CHARS = 100_000
_PARAM_TYPES = ("float", "int", "categorical")
_SWEEP_OWNED_KEYS = ("run_dir", "trainer.seed", "data.pinned_test_units")


# --------------------------------------------------------------------------- search space


@dataclass(frozen=True)
class ParamSpec:
    """One searched hyper-parameter: a config key and its distribution.

    Attributes:
        name: the dotted config key, as in a Hydra override (`learner.options.inner_lr`;
            `+sampler.options.x` adds a key the config lacks), or a config group (`learner`,
            whose choices are option names).
        kind: `float`, `int` or `categorical`.
        low, high: bounds (inclusive) of `float` and `int`.
        log: sample on a log scale.
        step: quantisation step of `float` and `int` (`None`: continuous float, 1 for int).
        choices: the values of `categorical`: strings, numbers, booleans, null, or lists of
            those (e.g. layer sizes `[40, 40]`; Optuna sees a list as its JSON text).
    """

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The value of this parameter for an Optuna trial."""
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        if self._encoded:
            label = trial.suggest_categorical(self.name, [json.dumps(c) for c in self.choices])
            return json.loads(label)
        return trial.suggest_categorical(self.name, list(self.choices))

    @property
    def _encoded(self) -> bool:
        return any(isinstance(choice, list) for choice in self.choices)

    def decode(self, stored: Any) -> Any:
        """The config value of a value as Optuna stores it (lists are kept as JSON text)."""
        return json.loads(stored) if self._encoded else stored


def load_search_space(path: str | os.PathLike) -> list[ParamSpec]:
    """Reads a search space from YAML: one entry per config key.

    Example file:
        learner.options.inner_lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}
        trainer.meta_batch_size: {type: int, low: 8, high: 32, step: 8}
        learner: {type: categorical, choices: [maml, fomaml]}

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: not a mapping, an unknown type or field, bounds missing or in the wrong
            order, a log scale with low ≤ 0, or empty choices — naming the parameter.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"search space file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"search space {path} is not valid YAML: {error}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(
            f"search space {path} must map config keys to distributions, e.g. "
            "'learner.options.inner_lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}'"
        )
    return [_parse_param(str(name), spec, path) for name, spec in raw.items()]


def _parse_param(name: str, spec: Any, path: Path) -> ParamSpec:
    where = f"search space {path}: {name}"
    if not re.fullmatch(r"(\+\+?)?[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", name):
        raise ValueError(
            f"{where}: not a config key (dotted names like learner.options.inner_lr, with a "
            "leading + for a key the config does not have yet)"
        )
    if name.lstrip("+") in _SWEEP_OWNED_KEYS:
        raise ValueError(f"{where}: set by the sweep itself, it cannot be searched")
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a mapping with 'type', got {spec!r}")
    kind = spec.get("type")
    if kind not in _PARAM_TYPES:
        raise ValueError(f"{where}: type must be one of {', '.join(_PARAM_TYPES)}, got {kind!r}")
    allowed = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}}
    allowed["categorical"] = {"choices"}
    unknown = set(spec) - allowed[kind] - {"type"}
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {sorted(unknown)} for type {kind} "
            f"(allowed: {sorted(allowed[kind])})"
        )
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"{where}: choices must be a non-empty list")
        for choice in choices:
            items = choice if isinstance(choice, list) else [choice]
            for item in items:
                if item is not None and not isinstance(item, (str, int, float, bool)):
                    raise ValueError(
                        f"{where}: choice {choice!r} is not a string, number, boolean or a "
                        "list of those"
                    )
        return ParamSpec(name, kind, choices=tuple(choices))
    values = {}
    for bound in ("low", "high", "step"):
        value = spec.get(bound)
        if value is None:
            if bound != "step":
                raise ValueError(f"{where}: {bound} is required for type {kind}")
            values[bound] = None
            continue
        try:  # YAML 1.1 reads 1e-3 (no dot) as a string
            number = float(value) if kind == "float" else value
        except (TypeError, ValueError):
            number = None
        if kind == "int" and (isinstance(number, bool) or not isinstance(number, int)):
            raise ValueError(f"{where}: {bound} must be an integer, got {value!r}")
        if number is None or isinstance(value, bool) or not math.isfinite(number):
            raise ValueError(f"{where}: {bound} must be a number, got {value!r}")
        values[bound] = number
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"{where}: log must be true or false, got {log!r}")
    if values["low"] > values["high"]:
        raise ValueError(f"{where}: low={values['low']} is above high={values['high']}")
    if log and values["low"] <= 0:
        raise ValueError(f"{where}: a log scale needs low > 0, got {values['low']}")
    if values["step"] is not None and values["step"] <= 0:
        raise ValueError(f"{where}: step must be > 0, got {values['step']}")
    if log and values["step"] is not None and kind == "float":
        raise ValueError(f"{where}: step and log cannot be combined for floats")
    return ParamSpec(name, kind, values["low"], values["high"], log, values["step"])


def format_override(name: str, value: Any) -> str:
    """`name=value` in Hydra's override syntax (strings quoted when they need it)."""
    return f"{name}={_override_value(value)}"


def _override_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(item) for item in value) + "]"
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, int):
        text = str(value)
    else:
        text = str(value)
        if not re.fullmatch(r"[\w./-]+", text) or text in ("null", "true", "false"):
            text = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


# --------------------------------------------------------------------------- sweep setup


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
        python: interpreter running the trials.
    """

    overrides: list[str]
    space: list[ParamSpec]
    sweep_dir: Path
    num_trials: int
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
        if self.launcher not in ("local", "slurm"):
            raise ValueError(f"--launcher must be local or slurm, got {self.launcher!r}")
        if self.pruner not in ("median", "none"):
            raise ValueError(f"--pruner must be median or none, got {self.pruner!r}")
        for name in ("nproc_per_node", "parallel", "max_failures"):
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if self.base_seed < 0 or self.test_seed < 0:
            raise ValueError("--seed and --test-seed must be >= 0")
        if not any(t.partition("=")[0] == "experiment" for t in self.overrides):
            raise ValueError("experiment=NAME is required")
        from metadist.launch.slurm import LAUNCH_KEYS, parse_settings

        # Training overrides among the launch settings would never reach the trials.
        _, stray = parse_settings(self.slurm_settings)
        if stray:
            raise ValueError(
                f"--slurm {stray[0]} is not a Slurm launch setting (one of "
                + ", ".join(LAUNCH_KEYS)
                + "); training overrides go after experiment=NAME"
            )
        searched = {p.name.lstrip("+") for p in self.space}
        for token in self.overrides:
            key, sep, _ = token.partition("=")
            if not sep:
                raise ValueError(f"expected a KEY=VALUE override, got {token!r}")
            key = key.lstrip("+~")
            if key in _SWEEP_OWNED_KEYS:
                raise ValueError(f"{key} is set by the sweep for every trial; remove {token!r}")
            if key in searched:
                raise ValueError(f"{key} is both searched (--space) and fixed ({token!r})")


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
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={settings.nproc_per_node}",
            ]
        tail = ["--config-dir", settings.config_dir] if settings.config_dir else []
        return [*head, "-m", "metadist.train", *self.overrides, *tail]


def plan_trial(
    settings: SweepSettings, number: int, seed: int, params: dict[str, Any], run_dir: Path
) -> TrialPlan:
    """The overrides of one trial, after checking that its configuration is valid.

    Composes the trial's config (base overrides + params), pins the meta-test units of
    `settings.test_seed`, and writes the trial's meta-train/val/test split to
    `<run_dir>/split.json`.

    Raises:
        ValueError: the composed config is invalid, or it has no meta-val evaluation
            (`trainer.eval_every` must be > 0 for a sweep).
    """
    from metadist.train.compose import load_config

    param_overrides = [format_override(name, value) for name, value in params.items()]
    base = [*settings.overrides, *param_overrides, f"trainer.seed={seed}"]
    config = load_config(base, settings.config_dir, world_size=_world_size(settings))
    if config.trainer.eval_every <= 0:
        raise ValueError(
            "trainer.eval_every must be > 0 in a sweep: the trials are scored and pruned "
            "on their meta-val metric (add e.g. trainer.eval_every=50)"
        )
    split = compute_split(config, settings.test_seed)
    overrides = list(base)
    if split["pins"]:
        pins = "data.pinned_test_units=[" + ",".join(map(str, split["pins"])) + "]"
        if len(pins) > _MAX_OVERRIDE_CHARS:
            raise ValueError(
                f"the pinned meta-test split has {len(split['test'])} units, too many for a "
                "command line; set data.pinned_test_units in the experiment config instead"
            )
        overrides.append(pins)
    overrides += ["logging.progress=false", f"run_dir={run_dir}"]
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_json(run_dir / SPLIT_FILE, {"seed": seed, "test_seed": settings.test_seed, **split})
    plan = TrialPlan(number, seed, dict(params), run_dir, overrides, config.trainer.meta_steps)
    _write_json(run_dir / COMMAND_FILE, {"argv": plan.train_command(settings)})
    return plan


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
    import numpy as np

    from metadist.tasks import build_task_sampler

    store = None
    if config.data.store is not None:
        from metadist.store import SeriesStore

        store = SeriesStore.open(config.data.store)
    sampler = build_task_sampler(config.sampler.name, store, **config.sampler.options)
    fractions = tuple(config.data.fractions)
    pins = config.data.pinned_test_units
    if pins is None and fractions[2] > 0:
        reference = config.data.partitioner(sampler, store, test_seed)
        pins = reference.units("test").tolist()
        if config.data.split_by in ("label", "stratum"):
            codes = store.label_codes if config.data.split_by == "label" else store.stratum_codes
            classes = np.asarray(codes)[sampler.unit_entities()[pins]]
            _, first = np.unique(classes, return_index=True)
            pins = [pins[i] for i in sorted(first)]
    trial_config = copy.deepcopy(config.data)
    trial_config.pinned_test_units = pins
    trial = trial_config.partitioner(sampler, store, config.trainer.seed)
    split = {name: trial.units(name).tolist() for name in ("train", "val", "test")}
    split["pins"] = list(pins or [])
    return split


def _world_size(settings: SweepSettings) -> int:
    if settings.launcher == "slurm":
        from metadist.launch.slurm import job_from_settings

        job, _ = job_from_settings(["experiment=x", *settings.slurm_settings], workdir="/")
        return job.nodes * int(job.nproc_per_node)
    return settings.nproc_per_node


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- reading metrics


def read_val_metric(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """`(step, value)` of every meta-val record of a run's `metrics.jsonl`, in order.

    A line being written (no newline yet) is skipped; a non-finite value reads as NaN.

    Raises:
        ValueError: a val record lacks `metric` (the message lists the keys it has).
    """
    path = run_dir / "metrics.jsonl"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    points: list[tuple[int, float]] = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("split") != "val":
            continue
        if metric not in record:
            keys = sorted(k for k in record if k not in ("step", "split", "time"))
            raise ValueError(f"--metric {metric!r} is not in the val records of {path}: {keys}")
        try:
            value = float(record[metric])
        except (TypeError, ValueError):
            value = float("nan")
        points.append((int(record["step"]), value))
    return points


# --------------------------------------------------------------------------- running trials


class LocalTrial:
    """A trial's training as a local subprocess group (killed as a whole on prune)."""

    def __init__(self, plan: TrialPlan, settings: SweepSettings) -> None:
        self.plan = plan
        self.log_path = plan.run_dir / LOG_FILE
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in finish)
        self.process = subprocess.Popen(
            plan.train_command(settings),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def poll(self) -> int | None:
        """The exit code once the training has exited, else `None`."""
        return self.process.poll()

    def stop(self, grace_seconds: float = 30.0) -> None:
        """SIGTERM to the whole group (checkpoint and exit), SIGKILL after the grace time."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.finish()

    def finish(self) -> None:
        if not self._log.closed:
            self._log.close()


class SlurmArrayWave:
    """Trials submitted together as one Slurm array job, one element per trial."""

    def __init__(self, plans: list[TrialPlan], settings: SweepSettings, wave: int) -> None:
        from metadist.launch.slurm import job_from_settings, submit_script, write_script

        wave_dir = settings.sweep_dir / "slurm" / f"wave{wave:04d}"
        wave_dir.mkdir(parents=True, exist_ok=True)
        for index, plan in enumerate(plans):
            (wave_dir / f"{index}.args").write_text("".join(f"{a}\n" for a in plan.overrides))
        experiment = next(
            t.partition("=")[2] for t in settings.overrides if t.startswith("experiment=")
        )
        base_job, _ = job_from_settings(
            [f"experiment={experiment}", *settings.slurm_settings], workdir=os.getcwd()
        )
        from dataclasses import replace

        job = replace(
            base_job,
            train_args=tuple(["--config-dir", settings.config_dir] if settings.config_dir else []),
            output=str(wave_dir / "%a.out"),
            array=f"0-{len(plans) - 1}",
            args_file=str(wave_dir / "${SLURM_ARRAY_TASK_ID}.args"),
            job_name=f"sweep-{experiment}",
            python=settings.python,
        )
        script = write_script(job, wave_dir / "job.sbatch")
        self.job_id = submit_script(script)
        self.wave_dir = wave_dir
        self.trials = [SlurmTrial(plan, self, index) for index, plan in enumerate(plans)]


class SlurmTrial:
    """One element of a `SlurmArrayWave`."""

    def __init__(self, plan: TrialPlan, wave: SlurmArrayWave, index: int) -> None:
        self.plan = plan
        self.wave = wave
        self.index = index
        self.element = f"{wave.job_id}_{index}"
        self.log_path = wave.wave_dir / f"{index}.out"

    def poll(self) -> int | None:
        queued = subprocess.run(
            ["squeue", "-h", "-r", "-j", self.element, "-o", "%T"],
            capture_output=True,
            text=True,
            check=False,
        )
        if queued.returncode == 0 and queued.stdout.strip():
            return None
        log = self.log_path
        text = log.read_text(errors="replace") if log.exists() else ""
        finished = re.findall(r"metadist: training finished with status (\d+)", text)
        if finished:
            return int(finished[-1])
        if queued.returncode == 0 or "Invalid job id" in queued.stderr:
            return 1  # left the queue without finishing (cancelled, node failure, ...)
        return None

    def stop(self, grace_seconds: float = 30.0) -> None:
        subprocess.run(["scancel", self.element], capture_output=True, check=False)

    def finish(self) -> None:
        """Nothing to close: the array job's output files belong to Slurm."""


# --------------------------------------------------------------------------- the sweep


def open_study(settings: SweepSettings):
    """The sweep's Optuna study (created in `<sweep_dir>/study.db`, or loaded from it)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if settings.pruner == "median":
        pruner = optuna.pruners.MedianPruner(
            n_startup_trials=settings.startup_trials, n_warmup_steps=settings.warmup_steps
        )
    else:
        pruner = optuna.pruners.NopPruner()
    return optuna.create_study(
        storage=f"sqlite:///{settings.sweep_dir.resolve() / STUDY_FILE}",
        study_name=STUDY_NAME,
        load_if_exists=True,
        direction=settings.direction,
        sampler=optuna.samplers.TPESampler(seed=settings.sampler_seed),
        pruner=pruner,
    )


def enqueue_trial(settings: SweepSettings, params: dict[str, Any], seed: int | None = None) -> None:
    """Queues a trial with fixed parameters (config values), run before any sampled one.

    Useful to start a sweep from a known configuration. `seed` pins the trial's seed
    (default: the one of its trial number).

    Raises:
        ValueError: a parameter that is not in the search space.
    """
    specs = {spec.name: spec for spec in settings.space}
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ValueError(f"parameters {unknown} are not in the search space ({sorted(specs)})")
    stored = {
        name: json.dumps(value) if specs[name]._encoded else value for name, value in params.items()
    }
    settings.sweep_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(settings)
    _check_meta(study, settings)
    study.enqueue_trial(stored, user_attrs={"seed": seed} if seed is not None else None)


@contextlib.contextmanager
def _sweep_lock(sweep_dir: Path):
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another sweep is running in {sweep_dir}") from None
        yield


def _sweep_meta(settings: SweepSettings) -> dict[str, Any]:
    """What defines a sweep's trials, stored with the study (JSON)."""
    meta = {
        "overrides": settings.overrides,
        "space": [p.__dict__ | {"choices": list(p.choices)} for p in settings.space],
        "metric": settings.metric,
        "direction": settings.direction,
        "base_seed": settings.base_seed,
        "test_seed": settings.test_seed,
        "world_size": _world_size(settings),
        "config_dir": settings.config_dir,
    }
    return json.loads(json.dumps(meta))


def _check_meta(study, settings: SweepSettings) -> None:
    """Refuses to continue a study with another experiment, space, metric or world size."""
    meta = _sweep_meta(settings)
    stored = study.user_attrs.get("sweep")
    if stored is None:
        study.set_user_attr("sweep", meta)
    elif stored != meta:
        raise ValueError(
            f"{settings.sweep_dir} holds a sweep with other settings "
            f"({json.dumps(stored)}); use another --sweep-dir"
        )


def run_sweep(settings: SweepSettings, log=print) -> Any:
    """Runs (or continues) the sweep until `num_trials` trials have completed or been pruned.

    Returns:
        The Optuna study.

    Raises:
        ValueError: bad settings, a trial configuration the training rejects, a sweep
            directory holding another sweep, or `max_failures` failed trials (naming
            their logs).
    """
    from optuna.trial import TrialState

    settings.validate()
    settings.sweep_dir = settings.sweep_dir.resolve()
    with _sweep_lock(settings.sweep_dir):
        study = open_study(settings)
        _check_meta(study, settings)
        # Trials still RUNNING were cut off by a stopped driver: run their settings again.
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            _run_again_later(study, frozen)
            log(f"trial {frozen.number} was interrupted; its parameters are queued again")
        running: dict[int, tuple[Any, Any]] = {}  # number -> (optuna trial, runner)
        reported: dict[int, int] = {}
        failures: list[str] = []
        wave = len(list((settings.sweep_dir / "slurm").glob("wave*")))

        def finished_count() -> int:
            done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            return len(done)

        try:
            while True:
                free = settings.parallel - len(running)
                wanted = settings.num_trials - finished_count() - len(running)
                if settings.launcher == "slurm" and running:
                    free = 0  # a wave is finished before the next one is submitted
                plans = []
                # Ctrl-C waits until the trials being started are tracked, so that none is
                # left running unseen.
                with _sigint_deferred():
                    for _ in range(max(0, min(free, wanted))):
                        trial = study.ask()
                        plan = _plan_asked_trial(study, trial, settings)
                        plans.append((trial, plan))
                        if settings.launcher == "local":
                            running[trial.number] = (trial, LocalTrial(plan, settings))
                    if plans and settings.launcher == "slurm":
                        array = SlurmArrayWave([p for _, p in plans], settings, wave)
                        wave += 1
                        for (trial, _), runner in zip(plans, array.trials, strict=True):
                            trial.set_user_attr("slurm_job", runner.element)
                            running[trial.number] = (trial, runner)
                for trial, plan in plans:
                    log(
                        f"trial {trial.number} started: seed {plan.seed}, "
                        f"{_format_params(plan.params)}"
                    )
                if not running:
                    break
                time.sleep(settings.poll_seconds)
                for number in list(running):
                    trial, runner = running[number]
                    exit_code = runner.poll()
                    points = read_val_metric(runner.plan.run_dir, settings.metric)
                    # Ask the pruner after every new point, not only the last of a poll: a
                    # fast run writes many points between polls, and the pruner compares
                    # trials at equal steps, which the other trials may only have early on.
                    prune_point = None
                    for step, value in points:
                        if step > reported.get(number, -1):
                            if math.isfinite(value):
                                trial.report(value, step)
                            reported[number] = step
                            if exit_code is None and trial.should_prune():
                                prune_point = (step, value)
                                break
                    if prune_point is not None:
                        runner.stop()
                        study.tell(trial, state=TrialState.PRUNED)
                        del running[number]
                        log(
                            f"trial {number} pruned at step {prune_point[0]}: "
                            f"{settings.metric}={prune_point[1]:.6g}"
                        )
                        _write_reports(study, settings)
                        continue
                    if exit_code is None:
                        continue
                    runner.finish()
                    del running[number]
                    last_step, final = points[-1] if points else (0, float("nan"))
                    reason = None
                    if exit_code != 0:
                        reason = f"exit status {exit_code}"
                    elif last_step != runner.plan.num_steps:
                        reason = f"stopped at step {last_step} of {runner.plan.num_steps}"
                    elif not math.isfinite(final):
                        reason = f"val {settings.metric} is {final}"
                    if reason is not None:
                        study.tell(trial, state=TrialState.FAIL)
                        failures.append(f"trial {number} ({reason}, see {runner.log_path})")
                        log(f"trial {number} failed: {reason}; log {runner.log_path}")
                        if len(failures) >= settings.max_failures:
                            raise ValueError(
                                f"{len(failures)} trials failed: " + "; ".join(failures)
                            )
                    else:
                        study.tell(trial, final)
                        log(f"trial {number} finished: {settings.metric}={final:.6g}")
                    _write_reports(study, settings)
        except BaseException:
            for number, (trial, runner) in running.items():
                runner.stop()
                with contextlib.suppress(Exception):
                    _run_again_later(study, trial)
                log(f"trial {number} stopped; it runs again when the sweep is continued")
            raise
        finally:
            _write_reports(study, settings)
        return study


def decode_params(settings: SweepSettings, stored: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters as config values (Optuna keeps list choices as JSON text)."""
    return {
        spec.name: spec.decode(stored[spec.name]) for spec in settings.space if spec.name in stored
    }


def _plan_asked_trial(study, trial, settings: SweepSettings) -> TrialPlan:
    """Seed, parameters and run directory of a trial just asked from the study."""
    from optuna.trial import TrialState

    seed = trial.user_attrs.get("seed")
    if seed is None:
        seed = settings.base_seed + trial.number
    trial.set_user_attr("seed", seed)
    params = {spec.name: spec.suggest(trial) for spec in settings.space}
    run_dir = settings.sweep_dir / "trials" / f"{trial.number:04d}"
    trial.set_user_attr("run_dir", str(run_dir))
    try:
        return plan_trial(settings, trial.number, seed, params, run_dir)
    except (ValueError, FileNotFoundError):
        study.tell(trial, state=TrialState.FAIL)
        raise


@contextlib.contextmanager
def _sigint_deferred():
    """Holds SIGINT back inside the block and delivers it after (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        signal.raise_signal(signal.SIGINT)


def _run_again_later(study, trial) -> None:
    """Marks an interrupted trial failed and queues its parameters and seed again."""
    from optuna.trial import TrialState

    study.tell(trial.number, state=TrialState.FAIL)
    study.enqueue_trial(dict(trial.params), user_attrs={"seed": trial.user_attrs.get("seed")})


def _format_params(params: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


# --------------------------------------------------------------------------- reports


def _write_reports(study, settings: SweepSettings) -> None:
    """Rewrites `trials.md` and `best.yaml` from the study."""
    import yaml
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    names = [p.name for p in settings.space]
    header = ["trial", "state", "seed", *names, settings.metric, "steps", "seconds"]
    rows = []
    for t in trials:
        value = "" if t.value is None else f"{t.value:.6g}"
        steps = max(t.intermediate_values) if t.intermediate_values else ""
        seconds = ""
        if t.datetime_start and t.datetime_complete:
            seconds = f"{(t.datetime_complete - t.datetime_start).total_seconds():.1f}"
        decoded = decode_params(settings, t.params)
        params = [_cell(decoded.get(name, "")) for name in names]
        rows.append(
            [
                str(t.number),
                t.state.name.lower(),
                str(t.user_attrs.get("seed", "")),
                *params,
                value,
                str(steps),
                seconds,
            ]
        )
    lines = [
        f"# Sweep: {' '.join(settings.overrides)}",
        "",
        f"{settings.direction} val `{settings.metric}`; {len(trials)} trials in `{STUDY_FILE}`.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    _write_text(settings.sweep_dir / TABLE_FILE, "\n".join(lines))
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    if not completed:
        return
    best = study.best_trial
    best_params = decode_params(settings, best.params)
    param_overrides = [format_override(k, v) for k, v in best_params.items()]
    document = {
        "experiment": next(
            t.partition("=")[2] for t in settings.overrides if t.startswith("experiment=")
        ),
        "metric": settings.metric,
        "direction": settings.direction,
        "value": float(best.value),
        "trial": best.number,
        "seed": best.user_attrs.get("seed"),
        "run_dir": best.user_attrs.get("run_dir"),
        "params": {k: _plain(v) for k, v in best_params.items()},
        "overrides": [
            *settings.overrides,
            *param_overrides,
            f"trainer.seed={best.user_attrs.get('seed')}",
        ],
    }
    _write_text(settings.sweep_dir / BEST_FILE, yaml.safe_dump(document, sort_keys=False))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- rerun


def rerun_trial(
    sweep_dir: str | os.PathLike, number: int, poll_seconds: float = 1.0, log=print
) -> tuple[float, float]:
    """Runs a completed trial again, locally, with its parameters, seed and world size.

    The sweep's settings are read from its study. The rerun goes to
    `<sweep_dir>/reruns/NNNN-K/`. Returns `(recorded, rerun)` values of the metric; on
    CPU they are equal bit for bit.

    Raises:
        FileNotFoundError: no study in `sweep_dir`.
        ValueError: no such trial, or it did not complete, or the rerun failed.
    """
    import optuna
    from optuna.trial import TrialState

    sweep_dir = Path(sweep_dir).resolve()
    if not (sweep_dir / STUDY_FILE).is_file():
        raise FileNotFoundError(f"no sweep in {sweep_dir} ({STUDY_FILE} missing)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{sweep_dir / STUDY_FILE}")
    meta = study.user_attrs.get("sweep")
    if meta is None:
        raise ValueError(f"{sweep_dir / STUDY_FILE} is not a metadist sweep")
    settings = SweepSettings(
        overrides=list(meta["overrides"]),
        space=[ParamSpec(**{**p, "choices": tuple(p["choices"])}) for p in meta["space"]],
        sweep_dir=sweep_dir,
        num_trials=1,
        metric=meta["metric"],
        direction=meta["direction"],
        base_seed=meta["base_seed"],
        test_seed=meta["test_seed"],
        nproc_per_node=meta["world_size"],
        poll_seconds=poll_seconds,
        config_dir=meta["config_dir"],
    )
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if number not in trials:
        raise ValueError(f"trial {number} is not in the study (it has {len(trials)} trials)")
    frozen = trials[number]
    if frozen.state != TrialState.COMPLETE:
        raise ValueError(f"trial {number} is {frozen.state.name.lower()}, not complete")
    reruns = settings.sweep_dir / "reruns"
    attempt = 0
    while (reruns / f"{number:04d}-{attempt}").exists():
        attempt += 1
    run_dir = reruns / f"{number:04d}-{attempt}"
    params = decode_params(settings, frozen.params)
    plan = plan_trial(settings, number, frozen.user_attrs["seed"], params, run_dir)
    runner = LocalTrial(plan, settings)
    while runner.poll() is None:
        time.sleep(settings.poll_seconds)
    runner.finish()
    points = read_val_metric(run_dir, settings.metric)
    if runner.poll() != 0 or not points or points[-1][0] != plan.num_steps:
        raise ValueError(f"the rerun of trial {number} failed; see {run_dir / LOG_FILE}")
    log(
        f"trial {number}: recorded {settings.metric}={frozen.value!r}, rerun {points[-1][1]!r} "
        f"({run_dir})"
    )
    return float(frozen.value), points[-1][1]


# --------------------------------------------------------------------------- CLI


def _settings_from_args(args: argparse.Namespace) -> SweepSettings:
    overrides = list(args.overrides)
    experiment = next((t.partition("=")[2] for t in overrides if t.startswith("experiment=")), "")
    if not experiment:
        raise ValueError("experiment=NAME is required")
    sweep_dir = Path(args.sweep_dir) if args.sweep_dir else Path("runs", "sweeps", experiment)
    if not args.space:
        raise ValueError("--space FILE is required (the search space, YAML)")
    space = load_search_space(args.space)
    return SweepSettings(
        overrides=overrides,
        space=space,
        sweep_dir=sweep_dir,
        num_trials=args.trials,
        metric=args.metric,
        direction=args.direction,
        base_seed=args.seed,
        test_seed=args.test_seed,
        launcher=args.launcher,
        nproc_per_node=args.nproc_per_node,
        parallel=args.parallel,
        pruner=args.pruner,
        startup_trials=args.startup_trials,
        warmup_steps=args.warmup_steps,
        sampler_seed=args.sampler_seed,
        poll_seconds=args.poll_seconds,
        max_failures=args.max_failures,
        config_dir=args.config_dir,
        slurm_settings=list(args.slurm),
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.rerun is not None:
        if not args.sweep_dir:
            raise ValueError("--rerun needs --sweep-dir (the sweep holding the trial)")
        recorded, rerun = rerun_trial(args.sweep_dir, args.rerun, args.poll_seconds)
        if recorded != rerun:
            print(
                f"trial {args.rerun} did not reproduce: {recorded!r} != {rerun!r}", file=sys.stderr
            )
            return 1
        print(f"trial {args.rerun} reproduced exactly")
        return 0
    settings = _settings_from_args(args)
    study = run_sweep(settings)
    print(f"trials: {settings.sweep_dir / TABLE_FILE}")
    if (settings.sweep_dir / BEST_FILE).exists():
        best = study.best_trial
        print(
            f"best: trial {best.number}, {settings.metric}={best.value:.6g} "
            f"({settings.sweep_dir / BEST_FILE})"
        )
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist sweep`."""
    parser = subparsers.add_parser(
        "sweep",
        help="hyper-parameter sweep: an Optuna study whose trials are training runs",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides of every trial; experiment=NAME is required",
    )
    parser.add_argument("--trials", type=int, default=10, help="trials to finish (default 10)")
    parser.add_argument("--space", help="search space YAML (required unless --rerun)")
    parser.add_argument("--sweep-dir", help="default runs/sweeps/<experiment>")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local")
    parser.add_argument("--metric", default="loss", help="meta-val metric (default loss)")
    parser.add_argument("--direction", choices=("minimize", "maximize"), default="minimize")
    parser.add_argument("--seed", type=int, default=0, help="trial k gets trainer.seed=SEED+k")
    parser.add_argument(
        "--test-seed", type=int, default=0, help="seed of the meta-test split pinned in every trial"
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        help="training processes per local trial (torchrun when > 1)",
    )
    parser.add_argument("--parallel", type=int, default=1, help="trials running at once")
    parser.add_argument("--pruner", choices=("median", "none"), default="median")
    parser.add_argument(
        "--startup-trials", type=int, default=2, help="finished trials before pruning starts"
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=0, help="steps of a trial before it may be pruned"
    )
    parser.add_argument("--sampler-seed", type=int, default=0, help="seed of the TPE sampler")
    parser.add_argument("--poll-seconds", type=float, default=1.0)
    parser.add_argument("--max-failures", type=int, default=3)
    parser.add_argument("--config-dir", help="experiments directory (passed to the training)")
    parser.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Slurm launch setting (repeatable), as in metadist slurm submit",
    )
    parser.add_argument(
        "--rerun",
        type=int,
        metavar="TRIAL",
        help="run a completed trial of --sweep-dir again and check its metric reproduces",
    )
    parser.set_defaults(func=_cmd_sweep)
