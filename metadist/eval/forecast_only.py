"""Evaluation settings that only forecasting reads, met by other tasks (few-shot
classification, regression scored as sampled): those that would add a method are refused
in one line before anything is scored, as a combination of forecasts is; those that
shape the report (per-group tables, the figure's forecasts) are named in a note, since
the settings every experiment starts from ask for them."""

from __future__ import annotations

from metadist.eval.settings import EvalOptions

# what tasks of each kind are called, and why they have no group to be tabled by
_KINDS = {
    "classification": (
        "few-shot classification",
        "an episode draws several classes, so it has no one stratum or label",
    ),
    "regression": ("tasks scored as sampled", "they come from no store's strata or labels"),
}


def check_forecast_only(options: EvalOptions, kind: str) -> list[str]:
    """The notes of the forecasting settings `options` asks for that tasks of `kind`
    (`classification`, `regression` or `forecast`) leave out; `[]` for forecasts.

    Raises:
        ValueError: `eval.combinations`, `eval.learned_combination` or
            `eval.extra_baselines` for tasks other than forecasts on a store, naming the
            field and what to set.
    """
    if kind == "forecast":
        return []
    if options.combinations:
        raise ValueError(
            "eval.combinations averages forecasts in original units, so it needs forecast "
            "tasks on a store; set it to null for this experiment"
        )
    if options.learned_combination is not None:
        raise ValueError(
            "eval.learned_combination weighs forecasts in original units, so it needs "
            "forecast tasks on a store; set it to null for this experiment"
        )
    if options.extra_baselines:
        raise ValueError(
            f"eval.extra_baselines={_listed(options.extra_baselines)} are forecast "
            "baselines, so they need forecast tasks on a store; set it to [] for this "
            "experiment"
        )
    tasks, why = _KINDS.get(kind, (f"{kind} tasks", "they have no strata or labels"))
    notes = []
    if options.group_by:
        notes.append(
            f"note: eval.group_by={_listed(options.group_by)} does not apply to {tasks} "
            f"({why}): no per-group tables; set it to [] for this experiment"
        )
    if options.num_examples > 0:
        notes.append(
            f"note: eval.num_examples={options.num_examples} does not apply to {tasks}: "
            "it is the number of forecasts drawn in the figure; set it to 0 for this "
            "experiment"
        )
    return notes


def _listed(values: list[str]) -> str:
    """`[a, b]`, as an override writes the list."""
    return f"[{', '.join(map(str, values))}]"
