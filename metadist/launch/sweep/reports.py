"""`trials.md` (every trial) and `best.yaml` (the best configuration as overrides)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metadist.durable import atomic_write_text
from metadist.launch.sweep.settings import (
    BEST_FILE,
    COMMAND_FILE,
    STUDY_FILE,
    TABLE_FILE,
    SweepSettings,
    decode_params,
)
from metadist.launch.sweep.space import format_override


def write_reports(study, settings: SweepSettings) -> None:
    """Rewrites `trials.md` and `best.yaml` from the study."""
    import yaml
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    names = [p.name for p in settings.space]
    # the last meta-step the trial validated (for an attempt cut off, not necessarily
    # its checkpoint's: its rerun resumes from the checkpoint, in a row of its own)
    header = ["trial", "state", "seed", *names, settings.metric, "last val step", "seconds"]
    header.append("note")
    # a cut-off attempt's run directory is the one its rerun resumes in
    by_dir: dict[Any, list[int]] = {}
    for t in trials:
        by_dir.setdefault(t.user_attrs.get("run_dir"), []).append(t.number)
    rows = []
    for t in trials:
        value = "" if t.value is None else f"{t.value:.6g}"
        steps = max(t.intermediate_values) if t.intermediate_values else ""
        seconds = ""
        if t.datetime_start and t.datetime_complete:
            seconds = f"{(t.datetime_complete - t.datetime_start).total_seconds():.1f}"
        # a queued trial's parameters are fixed, not yet suggested
        stored = t.params or t.system_attrs.get("fixed_params") or {}
        decoded = decode_params(settings, stored)
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
                _cell(_note(t, by_dir)),
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
        "overrides": _trial_overrides(best.user_attrs.get("run_dir"), settings.sweep_dir)
        or [*settings.overrides, *param_overrides, f"trainer.seed={best.user_attrs.get('seed')}"],
    }
    if settings.config_dir:
        document["config_dir"] = str(Path(settings.config_dir).resolve())
    _write_text(settings.sweep_dir / BEST_FILE, yaml.safe_dump(document, sort_keys=False))


def _trial_overrides(run_dir: str | None, sweep_dir: Path | None = None) -> list[str] | None:
    """The overrides the trial in `run_dir` (or its namesake under `sweep_dir/trials`,
    for a sweep continued from elsewhere) trained with, as its `command.json` records
    them (the pinned meta-test split included), less its run directory and progress
    setting: what reproduces it in a run of one's own. None where there is no record."""
    if not run_dir:
        return None
    places = [Path(run_dir)]
    if sweep_dir is not None:
        places.append(Path(sweep_dir) / "trials" / Path(run_dir).name)
    for place in places:
        try:
            argv = json.loads((place / COMMAND_FILE).read_text())["argv"]
            tail = argv[argv.index("metadist.train") + 1 :]
            break
        except (OSError, ValueError, KeyError, TypeError):
            continue
    else:
        return None
    overrides, skip = [], False
    for token in tail:
        if skip:
            skip = False
        elif token == "--config-dir":
            skip = True  # best.yaml's config_dir
        elif not token.startswith("--") and not token.startswith("run_dir="):
            overrides.append(token)
    # the sweep's own progress setting comes last (`settings.plan_trial`); a user's stays
    own = [i for i, token in enumerate(overrides) if token.startswith("logging.progress=")]
    if own:
        del overrides[own[-1]]
    return overrides


def _note(trial, by_dir: dict[Any, list[int]]) -> str:
    """Why a failed trial failed (as the sweep said it), or which trial resumed a cut-off
    attempt (the next one in its run directory)."""
    from optuna.trial import TrialState

    if trial.state != TrialState.FAIL:
        return ""
    if "failure" in trial.user_attrs:
        return str(trial.user_attrs["failure"])
    later = [n for n in by_dir.get(trial.user_attrs.get("run_dir"), []) if n > trial.number]
    return f"cut off; resumed as trial {min(later)}" if later else "cut off"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _write_text(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def format_params(params: dict[str, Any]) -> str:
    """`name=value, ...` for the sweep's log lines."""
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )
