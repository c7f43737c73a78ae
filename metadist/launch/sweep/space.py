"""The search space of a sweep: one distribution per config key, read from YAML."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARAM_TYPES = ("float", "int", "categorical")
# Keys every trial gets from the sweep itself; neither searched nor fixed by the user.
SWEEP_OWNED_KEYS = ("run_dir", "trainer.seed", "data.pinned_test_units", "logging.wandb.name")


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
            low, high = self._bounds()
            return trial.suggest_int(
                self.name, int(low), int(high), log=self.log, step=int(self.step or 1)
            )
        if self._encoded:
            label = trial.suggest_categorical(self.name, [json.dumps(c) for c in self.choices])
            return json.loads(label)
        return trial.suggest_categorical(self.name, list(self.choices))

    @property
    def _encoded(self) -> bool:
        return any(isinstance(choice, list) for choice in self.choices)

    def values(self) -> list[Any]:
        """Representative values: every choice, or both bounds of a range."""
        if self.kind == "categorical":
            return list(self.choices)
        low, high = self._bounds()
        if self.kind == "int":
            return [int(low), int(high)]
        return [float(low), float(high)]

    def _bounds(self) -> tuple[float, float]:
        """`(low, high)` of a range parameter (`load_search_space` requires both)."""
        assert self.low is not None and self.high is not None, self.name
        return self.low, self.high

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
    if path.is_dir():
        raise ValueError(f"search space file {path} is a directory; name the YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"search space file {path} does not exist")
    try:
        raw = yaml.load(path.read_text(), Loader=_unique_keys_loader())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "unreadable"
        raise ValueError(f"search space {path} is not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(
            f"search space {path} must map config keys to distributions, e.g. "
            "'learner.options.inner_lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}'"
        )
    return [_parse_param(str(name), spec, path) for name, spec in raw.items()]


def _unique_keys_loader() -> Any:
    """A safe YAML loader that refuses a key given twice in one mapping (plain YAML keeps
    the last, so a parameter searched twice would be searched once, silently)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen: set = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, Hashable):  # the loader names it (ConstructorError)
                    break
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} is given twice", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def _parse_param(name: str, spec: Any, path: Path) -> ParamSpec:
    where = f"search space {path}: {name}"
    if not re.fullmatch(r"(\+\+?)?[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", name):
        raise ValueError(
            f"{where}: not a config key (dotted names like learner.options.inner_lr, with a "
            "leading + for a key the config does not have yet)"
        )
    if name.lstrip("+") in SWEEP_OWNED_KEYS:
        raise ValueError(f"{where}: set by the sweep itself, it cannot be searched")
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a mapping with 'type', got {spec!r}")
    kind = spec.get("type")
    if kind not in PARAM_TYPES:
        raise ValueError(f"{where}: type must be one of {', '.join(PARAM_TYPES)}, got {kind!r}")
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
    values: dict[str, float | None] = {}
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
    low, high, step = values["low"], values["high"], values["step"]
    assert low is not None and high is not None  # required above
    if low > high:
        raise ValueError(f"{where}: low={low} is above high={high}")
    if log and low <= 0:
        raise ValueError(f"{where}: a log scale needs low > 0, got {low}")
    if step is not None and step <= 0:
        raise ValueError(f"{where}: step must be > 0, got {step}")
    if log and step is not None and kind == "float":
        raise ValueError(f"{where}: step and log cannot be combined for floats")
    return ParamSpec(name, kind, low, high, log, step)


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
