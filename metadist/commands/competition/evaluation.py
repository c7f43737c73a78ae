"""Each horizon's ensemble evaluated on the series of that horizon (their labels),
forecasting the holdout, next to the baselines and the learned combination (`fforma`:
weights of the model and the statistical methods per series, learned on each series'
last H training points; `eval.learned_combination=null` leaves it out)."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metadist.commands.competition.members import Member
from metadist.commands.competition.reuse import evaluated_before, inputs_digest, record_inputs
from metadist.commands.competition.series import SeriesInfo
from metadist.commands.competition.spec import SPEC_FILE, CompetitionSpec
from metadist.commands.competition.steps import step
from metadist.eval import evaluate_run
from metadist.eval.cache import PREDICTIONS_FILE
from metadist.eval.report import EVAL_DIR


def evaluate_horizons(
    ensembles: dict[int, list[Member]],
    out: Path,
    spec: CompetitionSpec,
    info: SeriesInfo,
    test_path: Path,
    ets: bool,
    extra: Sequence[str],
    loss: str = "",
) -> list[Path]:
    """Evaluates each horizon's ensemble (the eval overrides `extra` last); returns the
    evaluated run of each horizon, in the order of `ensembles`. `loss`: the candidate
    loss the ensembles were trained with, named in the step's title."""
    firsts = []
    for horizon, members in ensembles.items():
        labels = info.labels_of(horizon)
        # the evaluated run must look back furthest; the others are cut from its windows
        ordered = sorted(members, key=lambda m: -m.lookback)
        run_dirs = [m.run_dir(out) for m in ordered]
        overrides = evaluation_overrides(spec, info, labels, test_path, run_dirs[1:], ets, extra)
        models = f"{len(run_dirs)} {'model' if len(run_dirs) == 1 else 'models'}"
        trained = f", trained on {loss}" if loss else ""
        title = f"evaluate H={horizon} ({models}{trained}) on {', '.join(labels)}"
        digest = functools.partial(inputs_digest, run_dirs, [out / "store", test_path], overrides)
        step(title, functools.partial(_evaluate, run_dirs[0], overrides, digest))
        firsts.append(run_dirs[0])
    return firsts


def evaluate_candidates(
    horizon: int,
    candidates: dict[str, list[Member]],
    out: Path,
    spec: CompetitionSpec,
    info: SeriesInfo,
    test_path: Path,
    ets: bool,
    extra: Sequence[str],
) -> dict[str, Path]:
    """Evaluates one group's ensemble of each candidate loss (`{loss: members}`) on the
    same tasks; returns each one's evaluated run. The statistical baselines do not
    depend on the model (`metadist.eval.cache`): a candidate without a cache of its own
    starts from the first one's, so AutoETS is fitted once per group."""
    evaluated: dict[str, Path] = {}
    for loss, members in candidates.items():
        target = sorted(members, key=lambda m: -m.lookback)[0].run_dir(out)
        if evaluated:
            _share_cache(next(iter(evaluated.values())), target)
        first = evaluate_horizons(
            {horizon: members}, out, spec, info, test_path, ets, extra, loss=loss
        )
        evaluated[loss] = first[0]
    return evaluated


def _share_cache(source: Path, target: Path) -> None:
    """Copies the baseline cache of the run `source` to the run `target` where it has
    none (entries are keyed by their inputs: one that does not fit is never used)."""
    cache = source / EVAL_DIR / PREDICTIONS_FILE
    own = target / EVAL_DIR / PREDICTIONS_FILE
    if cache.is_file() and not own.exists():
        own.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cache, own)


def evaluation_overrides(
    spec: CompetitionSpec,
    info: SeriesInfo,
    labels: list[str],
    test_path: Path,
    others: list[Path],
    ets: bool,
    extra: Sequence[str],
) -> list[str]:
    """The `metadist eval` overrides of one horizon: its `labels`' series scored on the
    holdout in `test_path`, with the runs `others` in the ensemble; then `extra`."""
    ensemble = json.dumps([str(d) for d in others]) if others else "null"
    return [
        "eval.split=all",
        f"eval.labels={json.dumps(labels)}",
        f"eval.holdout={json.dumps(_holdout(test_path, spec))}",
        f"eval.seasonal_period={json.dumps({k: info.periods[k] for k in labels})}",
        "eval.seasonal_period_from=label",
        f"eval.group_by={json.dumps(['label'] + (['stratum'] if spec.stratum_col else []))}",
        f"eval.group_names={json.dumps(_group_names(spec))}",
        f"eval.references={json.dumps(_references(spec.references, labels))}",
        f"eval.ensemble={ensemble}",
        *(["eval.extra_baselines=[ets]"] if ets else []),
        f"eval.learned_combination={json.dumps(learned_candidates(ets))}",
        *extra,
    ]


def learned_candidates(ets: bool) -> list[str]:
    """The methods the learned combination weighs: the model, Theta, ETS (where scored),
    seasonal naive and naive."""
    return ["adapted", "theta", *(["ets"] if ets else []), "seasonal_naive", "naive"]


def want_ets(choice: str) -> bool:
    """Whether AutoETS is scored (`--ets auto|yes|no`).

    Raises:
        ValueError: `yes` without statsforecast installed.
    """
    if choice == "no":
        return False
    try:
        import statsforecast  # noqa: F401
    except ImportError:
        if choice == "yes":
            raise ValueError("--ets yes needs statsforecast: pip install 'metadist[ets]'") from None
        print("note: statsforecast is not installed: no ETS row (pip install 'metadist[ets]')")
        return False
    return True


def _evaluate(run_dir: Path, overrides: list[str], digest: Callable[[], str]) -> None:
    """Evaluates `run_dir`, or reads back its evaluation of the same inputs (`digest()`,
    `reuse.py`); says what it reused of an earlier evaluation's cache (the statistical
    forecasts, the from-scratch predictions), as `metadist eval` reports it."""
    before = digest()
    if evaluated_before(run_dir, before):
        print(f"   read back: {run_dir / EVAL_DIR} (the same inputs, evaluated before)")
        return
    result = evaluate_run(run_dir, overrides=overrides, progress=None)  # time left, every 15 s
    record_inputs(run_dir, before, digest)
    reused = result.get("settings", {}).get("reused")
    if reused:
        print(f"   reused: {reused}", flush=True)


def _holdout(path: Path, spec: CompetitionSpec) -> dict[str, Any]:
    return {
        "path": str(path),
        "entity_col": spec.entity_col,
        "time_col": spec.time_col,
        "value_cols": [spec.value_col],
    }


def _group_names(spec: CompetitionSpec) -> dict[str, str]:
    names = {"label": spec.label_col}
    if spec.stratum_col:
        names["stratum"] = spec.stratum_col
    return {**names, **spec.group_names}


def _references(references: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    """Each reference's figures for `labels` only (its overall figure is kept for the
    pooled table; a horizon's own table shows the labels it scores)."""
    out = {}
    for method, figures in references.items():
        if not isinstance(figures, dict):
            raise ValueError(f"{SPEC_FILE}: references.{method} must map all/label to figures")
        kept = {k: v for k, v in figures.items() if k != "label"}
        if isinstance(figures.get("label"), dict):
            kept["label"] = {k: v for k, v in figures["label"].items() if k in labels}
        out[method] = kept
    return out
