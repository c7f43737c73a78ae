"""What a validation run chooses per group beyond adaptation: the training loss among
the candidates, the width of the band that keeps the model's forecasts within what each
series' history makes plausible, and the weight of the model against seasonal naive
(`choices.json`).

A recipe with candidate losses (`--recipe cpu`: the data set's metric and sMAPE) trains
one ensemble per candidate under `--validation`, evaluates each, and keeps per group the
loss whose ensemble (adapted or not, whichever is better) scores best by the data set's
metric on the validation holdout. Where the ensemble spans several lookbacks
(`--recipe cpu`: 2H, 3H, 4H and 5H, N-BEATS-style; `--lookbacks` others), the members
of each shorter run of them from the first (2H alone, 2H and 3H, ...) are candidates of
their own (`prefix_key`), so each group keeps the whole ensemble or the first lookbacks
(`lookbacks` in its choice), whichever scored best; shorter trainings are candidates too
(`--step-candidates`, `candidates.py`: `steps` in the choice), and so are other starts of
the output layer (`--head-candidates`: `head`) and other experiments
(`--experiment-candidates`: `experiment`; another experiment only where it wins by more
than `--experiment-margin` standard errors, `switch.py`). On the chosen ensemble's
validation forecasts it then chooses the band's width per group
(`metadist.eval.plausibility`, "none" among them: the model unguarded), and on that
guarded model one weight `w` per group (`metadist.eval.fallback_combination`): the
forecast `w · model + (1 − w) · seasonal naive` scoring best there. All are written to
`OUT/choices.json`; a test run given `--adaptation-from VAL_OUT` trains each group's
chosen loss, length, head and experiment alone and reports the model within its band (the model as
chosen), unguarded and shrunk (`guard.py`). Nothing is
chosen on the competition holdout.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from metadist.commands.competition.guard import FALLBACK, guard_inputs, read_points
from metadist.commands.competition.switch import describe_switch, switch_test
from metadist.durable import atomic_write_text
from metadist.eval.fallback_combination import fit_shrinkage
from metadist.eval.plausibility import fit_width, guard_points, parse_width, width_label
from metadist.eval.report import EVAL_DIR, JSON_NAME

CHOICES_FILE = "choices.json"


def candidate_losses(
    metric: str, extra: Sequence[str], available: Sequence[str]
) -> tuple[str, ...]:
    """The losses tried per group: the data set's `metric` where a loss has its name,
    then `extra` (those of `available` only), each once."""
    out = [metric] if metric in available else []
    out += [loss for loss in extra if loss in available]
    return tuple(dict.fromkeys(out))


def prefix_key(loss: str, multiples: Sequence[float]) -> str:
    """The candidate of `loss`'s members of the lookbacks `multiples` of H alone
    (`smape L=2H`, `smape L=2H+3H`)."""
    return f"{loss} L=" + "+".join(f"{k:g}H" for k in multiples)


def split_key(key: str, lookbacks: Sequence[float]) -> tuple[str, list[float]]:
    """`(loss, lookbacks)` of a candidate named `key`: `prefix_key`'s lookbacks, else
    the loss's ensemble of all `lookbacks`."""
    loss, _, named = key.rpartition(" L=")
    if loss:
        by_name = {f"{k:g}H": float(k) for k in lookbacks}
        parts = named.split("+")
        if all(part in by_name for part in parts):
            return loss, [by_name[part] for part in parts]
    return key, [float(k) for k in lookbacks]


def best_method(run_dir: Path) -> tuple[str, float, str]:
    """`(method, score, metric)`: the better of the adapted and the unadapted forecast of
    an evaluated run by its primary metric (adapted only where strictly better; a
    non-finite score never wins)."""
    result = json.loads((run_dir / EVAL_DIR / JSON_NAME).read_text())
    metric = str(result["primary_metric"])
    scores = {}
    for method in ("adapted", "unadapted"):
        if method in result["overall"]:
            scores[method] = float(result["overall"][method][metric]["value"])
    finite = {m: s for m, s in scores.items() if np.isfinite(s)}
    if not finite:
        return "adapted", float("nan"), metric
    method = min(finite, key=lambda m: (finite[m], m != "adapted"))
    return method, finite[method], metric


def choose_group(
    runs: dict[str, Path], others: Collection[str] = (), margin: float = 0.0
) -> dict[str, Any]:
    """One group's choice from its candidates' evaluated runs `{loss: run_dir}`: the
    loss (first on a tie; the run's own experiment on a tie with another), its better
    method, the band width of that method's forecasts
    (`metadist.eval.plausibility.fit_width`) and the weight of the guarded forecast
    against seasonal naive, all on the same validation forecasts. The candidates of
    another experiment (`others`) win only by more than `margin` standard errors, or
    where none of the run's own scores (`switch.py`; 0: by any score, as the rest)."""
    scored = {loss: best_method(run) for loss, run in runs.items()}
    finite = [loss for loss in runs if np.isfinite(scored[loss][1])]
    own = [loss for loss in finite if loss not in others]
    loss = min(own or finite, key=lambda k: scored[k][1]) if finite else next(iter(runs))
    rival = min((k for k in finite if k in others), key=lambda k: scored[k][1], default=None)
    test = None
    if own and rival is not None and scored[rival][1] < scored[loss][1]:
        if margin > 0:
            test = switch_test(
                (runs[loss], scored[loss][0]), (runs[rival], scored[rival][0]),
                scored[loss][2], margin,
            )  # fmt: skip
            test = {"candidate": rival, "against": loss, **test}
        loss = rival if test is None or test["switched"] else loss
    method, _, metric = scored[loss]
    points = read_points(runs[loss], method)
    # the band's width first (a tie keeps the wider band, no guard above all), then the
    # weight of the model within it
    histories, periods = guard_inputs(points, runs[loss])
    width, guards = fit_width(
        metric, points["truth"], points["model"], points["task"], histories, periods,
        points["scale"],
    )  # fmt: skip
    points["model"] = guard_points(points["model"], points["task"], histories, periods, width)
    weight, weights = fit_shrinkage(
        metric,
        points["truth"],
        points["model"],
        points["fallback"],
        points["task"],
        points["scale"],
    )
    return {
        "metric": metric,
        "losses": {k: v[1] for k, v in scored.items()},
        "loss": loss,
        "method": method,
        "guard": width_label(width),
        "guards": guards,
        "fallback": FALLBACK,
        "weight": weight,
        "weights": {f"{w:.1f}": s for w, s in weights.items()},
        "switch": test,
    }


def write_choices(
    out: Path, groups: dict[str, dict[str, Any]], validation: bool, source: Path | None = None
) -> None:
    """`OUT/choices.json`: each group's choice, the protocol it was made on (a test run
    records the choices it applied, and the validation run they came from: `source`)."""
    document: dict[str, Any] = {"protocol": "validation" if validation else "test"}
    if source is not None:
        document["from"] = str(source)
    document["groups"] = groups
    atomic_write_text(out / CHOICES_FILE, json.dumps(document, indent=1) + "\n")


def describe(key: str, entry: dict[str, Any]) -> str:
    """One printed line of a group's choice."""
    losses = ", ".join(f"{k} {v:.3f}" for k, v in entry["losses"].items())
    guards = ", ".join(f"{k} {v:.3f}" for k, v in entry.get("guards", {}).items())
    return (
        f"== H={key}: validation {entry['metric']} by loss: {losses}; chosen {entry['loss']} "
        f"{_lookbacks(entry)}({entry['method']}); band width {entry.get('guard', 'none')} (validation "
        f"{entry['metric']}: {guards}); weight of the model against {entry['fallback']}: "
        f"{entry['weight']:.1f}{describe_switch(entry['switch']) if entry.get('switch') else ''}"
    )


def _lookbacks(entry: dict[str, Any]) -> str:
    """`10 meta-steps, zero head, lookbacks 2H, 3H ` of a choice that records a shorter
    training, another head and lookbacks (each where it does), else nothing."""
    parts = []
    if entry.get("steps") is not None:
        parts.append(f"{entry['steps']} meta-steps")
    if entry.get("head") is not None:
        parts.append(f"{entry['head']} head")
    if entry.get("experiment") is not None:
        parts.append(f"experiment {entry['experiment']}")
    if entry.get("lookbacks"):
        parts.append("lookbacks " + ", ".join(f"{float(k):g}H" for k in entry["lookbacks"]))
    return ", ".join(parts) + " " if parts else ""


def _steps(value: Any) -> int | None:
    """A choice's training length: None (the experiment's, or a choice written before
    shorter trainings were candidates), or a positive whole number of meta-steps.

    Raises:
        ValueError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"steps {value!r}")
    return value


def _name(value: Any) -> str | None:
    """A choice's start of the output layer or experiment: None (the run's, or a
    choice written before these were candidates), or a name of one
    (`model.options.head_init`, a config of `experiments/experiment/`).

    Raises:
        ValueError: anything else.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value.replace("-", "_").isidentifier():
        raise ValueError(f"name {value!r}")
    return value


def read_choices(
    val_out: Path, keys: Sequence[str], metric: str
) -> dict[str, dict[str, Any]] | None:
    """Each group's choice from a validation run's `choices.json` (None: it has none,
    a run without candidate losses).

    Raises:
        ValueError: the file is not valid, was written by a test run, lacks a group of
            `keys`, or chose by another metric than `metric`.
    """
    path = val_out / CHOICES_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
        protocol, groups = document["protocol"], document["groups"]
        entries = {str(k): dict(v) for k, v in groups.items()}
        for entry in entries.values():
            str(entry["loss"]), float(entry["weight"]), str(entry["metric"])
            parse_width(entry.get("guard"))
            if entry.get("lookbacks") is not None:
                entry["lookbacks"] = [float(k) for k in entry["lookbacks"]]
            entry["steps"] = _steps(entry.get("steps"))
            entry["head"] = _name(entry.get("head"))
            entry["experiment"] = _name(entry.get("experiment"))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{path} is not a choice written by metadist competition") from None
    if protocol != "validation":
        raise ValueError(
            f"{path} was written by a {protocol} run; --adaptation-from takes a --validation "
            "run's output (settings are never chosen on the test holdout)"
        )
    missing = [k for k in keys if k not in entries]
    if missing:
        raise ValueError(
            f"{path} has no choice for horizon {missing[0]} (it has {', '.join(sorted(entries))})"
        )
    other = sorted({e["metric"] for e in entries.values()} - {metric})
    if other:
        raise ValueError(
            f"{path} chose by {other[0]}, this run's primary metric is {metric}: run the "
            "validation protocol again with the same metric"
        )
    return {k: entries[k] for k in keys}
