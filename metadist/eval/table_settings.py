"""The settings of the report's tables, checked with the other evaluation settings
(`EvalOptions.validate`): what the strata and labels are called (`eval.group_names`) and
the published figures shown beside the primary metric (`eval.references`). The report
reads them only once every task is scored, so a bad one is refused before any work.
"""

from __future__ import annotations

import math
from typing import Any


def check_table_names(options: Any) -> None:
    """eval.group_names (stratum and label to names) and eval.references (published
    figures: `{method: {all: X, stratum or label: {group: X}}}`) of `options` (an
    `EvalOptions`), which the report reads only after every task is scored.

    Raises:
        ValueError: naming the first bad field.
    """
    for grouping, name in options.group_names.items():
        if grouping not in ("stratum", "label") or not isinstance(name, str) or not name:
            raise ValueError(
                "eval.group_names maps stratum and label to what the tables call them, e.g. "
                f"{{label: frequency}}, got {grouping}: {name!r}"
            )
    for method, figures in options.references.items():
        where = f"eval.references.{method}"
        if not isinstance(figures, dict):
            raise ValueError(
                f"{where} must map all (and stratum or label) to published figures, e.g. "
                f"{{all: 13.01, label: {{yearly: 16.9}}}}, got {figures!r}"
            )
        for key, value in figures.items():
            if key == "all":
                _check_figure(f"{where}.all", value)
            elif not isinstance(value, dict):
                raise ValueError(
                    f"{where}.{key} must map each {key} to its published figure, e.g. "
                    f"{{yearly: 16.9}}, got {value!r}"
                )
            else:
                for group, figure in value.items():
                    _check_figure(f"{where}.{key}.{group}", figure)


def _check_figure(where: str, figure: Any) -> None:
    """A published figure: a finite number, or null where the source gives none."""
    number = isinstance(figure, (int, float)) and not isinstance(figure, bool)
    if figure is not None and not (number and math.isfinite(figure)):
        raise ValueError(f"{where} must be a number (or null), got {figure!r}")
