"""The sweep's Optuna study in `<sweep_dir>/study.db`: opening it safely, its settings,
the lock that keeps one driver per sweep, and trials cut off by a stopped driver."""

from __future__ import annotations

import contextlib
import fcntl
import json
import sqlite3
from pathlib import Path
from typing import Any

from metadist.launch.sweep.runners import cancel_slurm_element, stop_leftover
from metadist.launch.sweep.settings import STUDY_FILE, STUDY_NAME, SweepSettings, world_size

_SQLITE_HEADER = b"SQLite format 3\x00"


# the lock a running driver holds in its sweep directory
LOCK_FILE = ".lock"


def open_study(settings: SweepSettings, *, create: bool = True):
    """The sweep's Optuna study (created in `<sweep_dir>/study.db`, or loaded from it;
    only loaded when not `create`).

    The TPE sampler is seeded from `sampler_seed` and the number of trials the study
    already has, so a continued sweep goes on with fresh suggestions instead of
    replaying those of its first start.

    Raises:
        ValueError: `study.db` is empty, not SQLite, corrupt, holds no metadist sweep or
            holds another Optuna study (nothing is added to it); or there is no
            `study.db` but trial directories of an earlier sweep.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = settings.sweep_dir.resolve() / STUDY_FILE
    _check_study_file(path)
    pruner: optuna.pruners.BasePruner
    if settings.pruner == "median":
        pruner = optuna.pruners.MedianPruner(
            n_startup_trials=settings.startup_trials, n_warmup_steps=settings.warmup_steps
        )
    else:
        pruner = optuna.pruners.NopPruner()
    try:
        if create:
            study = optuna.create_study(
                storage=f"sqlite:///{path}",
                study_name=STUDY_NAME,
                load_if_exists=True,
                direction="maximize" if settings.direction == "maximize" else "minimize",
                pruner=pruner,
            )
        else:
            study = optuna.load_study(
                storage=f"sqlite:///{path}", study_name=STUDY_NAME, pruner=pruner
            )
        num_trials = len(study.get_trials(deepcopy=False))
    except Exception as error:  # SQLAlchemy and Optuna errors about this one file
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"{path} cannot be read as a sweep study ({detail}); move it away to start a "
            "new sweep, or use another --sweep-dir"
        ) from None
    study.sampler = optuna.samplers.TPESampler(seed=sampler_seed(settings, num_trials))
    return study


def sampler_seed(settings: SweepSettings, num_trials: int) -> int:
    """The TPE seed of a driver that starts on a study of `num_trials` trials."""
    if num_trials == 0:
        return settings.sampler_seed
    import numpy as np

    sequence = np.random.SeedSequence([settings.sampler_seed, num_trials])
    return int(sequence.generate_state(1)[0])


def _check_study_file(path: Path) -> None:
    if not path.exists():
        trials = path.parent / "trials"
        if trials.is_dir() and any(trials.iterdir()):
            raise ValueError(
                f"{path.parent} holds trial directories but no {STUDY_FILE}: its study was "
                "removed; use another --sweep-dir (or remove trials/ to start over there)"
            )
        # a new sweep starts in a new or empty directory (its lock aside): not among a
        # run's checkpoints or another sweep's trial directories
        other = sorted(p.name for p in path.parent.iterdir() if p.name != LOCK_FILE)
        if other:
            raise ValueError(
                f"--sweep-dir {path.parent} holds no sweep ({STUDY_FILE}) but other files "
                f"({', '.join(other[:3])}{' ...' if len(other) > 3 else ''}); a new sweep "
                "needs a new or empty directory"
            )
        return
    if not path.is_file():
        raise ValueError(f"{path} is not a file; a sweep keeps its study there")
    with open(path, "rb") as handle:
        header = handle.read(len(_SQLITE_HEADER))
    if not header:
        raise ValueError(
            f"{path} is empty (0 bytes), not a sweep study; move it away to start a new "
            "sweep, or use another --sweep-dir"
        )
    if header != _SQLITE_HEADER:
        raise ValueError(
            f"{path} is not an SQLite database, so not a sweep study; move it away or use "
            "another --sweep-dir"
        )
    _check_study_names(path)


def _check_study_names(path: Path) -> None:
    """Refuses an SQLite file that holds anything but this sweep's study: tables that are
    not Optuna's, or another Optuna study, which opening it would write into. Read-only."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
            names = (
                [row[0] for row in db.execute("SELECT study_name FROM studies")]
                if "studies" in tables
                else []
            )
    except sqlite3.Error as error:
        raise ValueError(
            f"{path} cannot be read as a sweep study ({error}); move it away to start a new "
            "sweep, or use another --sweep-dir"
        ) from None
    if tables and "studies" not in tables:
        raise ValueError(
            f"{path} is an SQLite database of something else (tables {', '.join(sorted(tables))}"
            "), not a sweep study; move it away or use another --sweep-dir"
        )
    others = sorted(name for name in names if name != STUDY_NAME)
    if others:
        raise ValueError(
            f"{path} holds another Optuna study ({others[0]!r}), not a metadist sweep; move "
            "it away or use another --sweep-dir"
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
    check_meta(study, settings)
    study.enqueue_trial(stored, user_attrs={"seed": seed} if seed is not None else None)


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path):
    """Holds `<sweep_dir>/.lock`: one driver per sweep directory. Where no study was made
    when the driver ends (refused, or stopped at once), the lock goes, and the directory
    too where it made it and nothing else is there."""
    made = not sweep_dir.exists()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / LOCK_FILE, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # the other driver's: nothing here is this one's to remove
            raise ValueError(f"another sweep is running in {sweep_dir}") from None
        try:
            yield
        finally:  # still holding the lock
            if not (sweep_dir / STUDY_FILE).exists():  # no sweep was made: leave nothing
                (sweep_dir / LOCK_FILE).unlink(missing_ok=True)
                if made and not any(sweep_dir.iterdir()):
                    sweep_dir.rmdir()


def sweep_meta(settings: SweepSettings) -> dict[str, Any]:
    """What defines a sweep's trials, stored with the study (JSON)."""
    meta = {
        "overrides": settings.overrides,
        "space": [p.__dict__ | {"choices": list(p.choices)} for p in settings.space],
        "metric": settings.metric,
        "direction": settings.direction,
        "base_seed": settings.base_seed,
        "test_seed": settings.test_seed,
        "world_size": world_size(settings),
        "config_dir": settings.config_dir,
    }
    return json.loads(json.dumps(meta))


def check_meta(study, settings: SweepSettings) -> None:
    """Records what a new study is for (`sweep_meta`: the overrides, hence the
    experiment; the space; the objective, metric and direction; the seeds, world size and
    config directory), or refuses to continue a study made for anything else.

    Raises:
        ValueError: in one line, naming what differs; or a study with trials that records
            no settings (not made by `metadist sweep`).
    """
    meta = sweep_meta(settings)
    stored = study.user_attrs.get("sweep")
    if stored is None:
        if study.get_trials(deepcopy=False):
            raise ValueError(
                f"{settings.sweep_dir / STUDY_FILE} holds a study with trials but no record "
                "of its sweep's settings (not made by metadist sweep); move it away or use "
                "another --sweep-dir"
            )
        study.set_user_attr("sweep", meta)  # a new study (or one its driver left empty)
    elif stored != _as_recorded(meta, stored):
        raise ValueError(
            f"{settings.sweep_dir / STUDY_FILE} holds a sweep made for other settings ("
            f"{'; '.join(_differences(stored, meta))}); continue it with its own settings, "
            "or use another --sweep-dir"
        )


def _as_recorded(meta: dict[str, Any], stored: Any) -> dict[str, Any]:
    """`meta` with its (resolved) config directory as a study made before they were
    resolved recorded it (relative to the working directory, with a trailing slash,
    through a link), where that is the same place."""
    if not isinstance(stored, dict):
        return meta
    recorded, now = stored.get("config_dir"), meta.get("config_dir")
    if not (isinstance(recorded, str) and isinstance(now, str)):
        return meta
    if Path(recorded).resolve() == Path(now):  # relative, with a slash, through a link
        return {**meta, "config_dir": recorded}
    return meta


def _differences(stored: Any, meta: dict[str, Any]) -> list[str]:
    """What differs between a study's recorded settings and these, shortly."""
    if not isinstance(stored, dict):
        return ["its record is not a mapping"]
    found = []
    for key, now in meta.items():
        was = stored.get(key, "(not recorded)")
        if was == now:
            continue
        if key == "overrides" and isinstance(was, list):
            gone = [o for o in was if o not in now]
            new = [o for o in now if o not in was]
            found.append(
                f"overrides: recorded only {gone}, now only {new}"
                if gone or new
                else f"overrides in another order: recorded {was}"
            )
        elif key == "space" and isinstance(was, list):
            found.append(f"space: {_space_difference(was, now)}")
        else:
            found.append(f"{key}: recorded {was!r}, now {now!r}")
    found += [f"{key}: recorded {stored[key]!r}, now none" for key in stored if key not in meta]
    return found


def _space_difference(was: list[Any], now: list[dict[str, Any]]) -> str:
    """The searched parameters that differ, by name."""
    recorded = {p.get("name"): p for p in was if isinstance(p, dict)}
    current = {p["name"]: p for p in now}
    parts = [
        f"{name} differs"
        for name in current
        if name in recorded and recorded[name] != current[name]
    ]
    parts += [f"{name} only recorded" for name in recorded if name not in current]
    parts += [f"{name} only now" for name in current if name not in recorded]
    return ", ".join(str(part) for part in parts) or "parameters in another order"


def run_again_later(study, trial) -> None:
    """Marks an interrupted trial failed and queues it again: same parameters, seed and
    run directory, so that its training resumes from the attempt's last checkpoint."""
    from optuna.trial import TrialState

    study.tell(trial.number, state=TrialState.FAIL)
    attrs = {key: trial.user_attrs.get(key) for key in ("seed", "run_dir")}
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)


def recover_interrupted(study, log) -> None:
    """Trials still RUNNING were cut off by a driver that died: their training is stopped
    if it still runs (local process group, Slurm element), then they are queued again."""
    from optuna.trial import TrialState

    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if stop_leftover(frozen.user_attrs.get("process")):
            log(f"trial {frozen.number}: stopped the training left by the earlier driver")
        element = frozen.user_attrs.get("slurm_job")
        if element:
            cancel_slurm_element(element)
        run_again_later(study, frozen)
        log(f"trial {frozen.number} was interrupted; it runs again from its last checkpoint")
