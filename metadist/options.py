"""Typed settings from plain mappings: one way to read every config section.

Hydra composes and overrides; a dataclass decides what a section holds. `from_mapping`
builds a dataclass instance from a nested mapping, coercing each value to its field's
annotation and raising `ValueError` that names the full field path
(`model.options.hidden_sizes`), with the closest valid name for an unknown key. The
training config, the evaluation settings, sweeps and every registered component's
options (`metadist.registry`) go through it. `Configurable` is the shape of a component
that keeps its options typed: a nested `Options` dataclass, read once and kept as
`self.options`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import inspect
import numbers
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice most like `name` (a likely misspelling), or None when none is close."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key_error(path: str, key: str, choices: Iterable[str], what: str) -> ValueError:
    """`ValueError` for `path` (which ends in `key`) not being one of `choices`.

    Example: `model.options.hiden_sizes: unknown option of model 'mlp'; did you mean
    'hidden_sizes'? (valid: activation, dropout, hidden_sizes)`.
    """
    choices = sorted(choices)
    guess = closest(key, choices)
    hint = f"; did you mean {guess!r}?" if guess else ""
    if not guess and "options" in choices:  # a component's option set one level too high
        hint = f"; a component's option is {path[: -len(key)]}options.{key}"
    listing = ", ".join(choices) if choices else "none"
    return ValueError(f"{path}: unknown {what}{hint} (valid: {listing})")


def from_mapping(cls: type, values: Any, path: str = "", what: str = "field") -> Any:
    """An instance of dataclass `cls` from `values`, every field coerced and checked.

    Args:
        cls: a dataclass; nested dataclass fields are read from nested mappings.
        values: a mapping of field name to value; missing fields take their defaults.
        path: where `values` sits in the whole config (`"model.options"`), for messages.
        what: what a key is called in messages ("field", "option").

    Raises:
        ValueError: an unknown key (with the closest valid name), a value of the wrong
            type, or a missing required field, naming the full path.
    """
    where = path or "the config"
    if not isinstance(values, Mapping):
        raise ValueError(f"{where} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    prefix = f"{path}." if path else ""
    for key in values:
        if key not in names:
            raise unknown_key_error(f"{prefix}{key}", str(key), names, what)
    kwargs = {name: coerce(hints[name], values[name], f"{prefix}{name}") for name in values}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{prefix}{missing[0]} is required")
    return cls(**kwargs)


def coerce(hint: Any, value: Any, name: str) -> Any:
    """`value` checked against the annotation `hint` (ints widen to floats, lists to
    tuples where the hint says so); `ValueError` naming `name` when it does not fit."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise ValueError(f"{name} must not be null")
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return coerce(inner[0], value, name)
        for option in inner:  # the first member the value fits
            try:
                return coerce(option, value, name)
            except ValueError:
                continue
        raise ValueError(f"{name}: {value!r} is none of {', '.join(map(_shown, inner))}")
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_mapping(hint, value, name)
    if hint is Any:
        return value
    if value is None:
        raise ValueError(f"{name} must not be null")
    # numpy's scalars and 1-d arrays (a value computed from a store) are read as the
    # Python values they hold, so the options stay plain (YAML, JSON, equality)
    if hint is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be true or false, got {_one_line(value)}")
        return bool(value)
    if hint is int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise ValueError(
                f"{name} must be an integer, got {_one_line(value)}{_a_string(value, name)}"
            )
        return int(value)
    if hint is float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise ValueError(
                f"{name} must be a number, got {_one_line(value)}{_a_string(value, name)}"
            )
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {_one_line(value)}")
        return value
    if origin is collections.abc.Sequence and isinstance(value, str):
        return value  # a str is a Sequence: the component decides what one string means
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if origin in (tuple, list, collections.abc.Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {_one_line(value)}")
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) != len(value):
            raise ValueError(f"{name} must have {len(args)} entries, got {list(value)}")
        items = [
            coerce(_item_hint(origin, args, i), v, f"{name}[{i}]") for i, v in enumerate(value)
        ]
        return tuple(items) if origin is tuple else items
    if origin in (dict, collections.abc.Mapping) or hint in (dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping, got {_one_line(value)}")
        return dict(value)
    if isinstance(hint, type):
        if not isinstance(value, hint):
            raise ValueError(f"{name} must be a {hint.__name__}, got {_one_line(value)}")
        return value
    return value  # an annotation this reader does not interpret: the component checks it


def _a_string(value: Any, name: str) -> str:
    """For a number written as a string (`'3'`): where such a string comes from, and the
    override that reads an environment variable's value as a number."""
    if not isinstance(value, str):
        return ""
    try:
        float(value)
    except ValueError:
        return ""
    return (
        ", a string (quoted, or an ${oc.env:NAME} value, always a string: "
        f"'{name}=\"${{oc.decode:${{oc.env:NAME}}}}\"' reads it as a number)"
    )


def _one_line(value: Any) -> str:
    """`repr(value)` on one line (a numpy array's spans several)."""
    return " ".join(repr(value).split())


def _item_hint(origin: Any, args: tuple, index: int) -> Any:
    if not args:
        return Any
    if origin is tuple and args[-1] is not Ellipsis:
        return args[index]
    return args[0]


def _shown(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def to_plain(value: Any) -> Any:
    """Nested dataclasses/tuples as plain dicts/lists (JSON- and YAML-safe)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def signature_options(function: Any, skip: int, name: str) -> type:
    """A dataclass of the keyword parameters of `function` (after the first `skip`
    positional ones, `self` included), with their annotations and defaults: the option
    schema of a component whose constructor declares its options as keywords."""
    hints = typing.get_type_hints(function)
    parameters = list(inspect.signature(function).parameters.values())[skip:]
    fields: list[Any] = []
    for parameter in parameters:
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            continue
        hint = hints.get(parameter.name, Any)
        if parameter.default is inspect.Parameter.empty:
            fields.append((parameter.name, hint))
        else:
            fields.append((parameter.name, hint, dataclasses.field(default=parameter.default)))
    fields.sort(key=lambda f: len(f) == 3)  # required before defaulted, as dataclasses need
    return dataclasses.make_dataclass(name, fields, frozen=True)


class Configurable:
    """A component whose options are its nested frozen `Options` dataclass, kept typed.

    A subclass's `Options` extends its parent's with only what it adds (it may also give
    an inherited option another default). The constructor takes the options as keywords
    (`ForecastSampler(store, lookback=32)`) or as one typed object (`options=...`, what
    `metadist.registry.Registry.build` passes after reading a config's mapping), and keeps
    them, checked, as `self.options`:

        class MySampler(TaskSampler, Configurable):
            @dataclass(frozen=True)
            class Options:
                width: int = 3

                def validate(self) -> None:  # optional: value checks naming the option
                    check_positive("my_sampler", width=self.width)

            def __init__(self, *, options: Options | None = None, **keywords: Any) -> None:
                self.options = self.read_options(keywords, options)
    """

    Options: ClassVar[type]
    # Where the options sit in a config, and what the component is, for messages.
    options_path: ClassVar[str] = "options"
    options_label: ClassVar[str] = "component"

    @classmethod
    def read_options(cls, keywords: Mapping[str, Any], options: Any = None) -> Any:
        """The checked `cls.Options` of one construction: `options` itself when given
        (then no `keywords`), else `keywords` read with `from_mapping`; `validate()` run
        where the `Options` class has one.

        Raises:
            ValueError: an unknown option (with the closest one), a value of the wrong type
                (naming `<options_path>.<option>`), or one `validate` refuses.
            TypeError: both `options` and keywords, or `options` of another class.
        """
        if options is None:
            name = getattr(cls, "name", "") or cls.__name__
            what = f"option of {cls.options_label} {name!r}"
            options = from_mapping(cls.Options, keywords, cls.options_path, what=what)
        elif keywords:
            raise TypeError(
                f"{cls.__name__}: give its options as keywords or as one options object, "
                f"not both (got options and {sorted(keywords)})"
            )
        elif not isinstance(options, cls.Options):
            raise TypeError(
                f"{cls.__name__}: options must be a {cls.__name__}.Options, got "
                f"{type(options).__name__}"
            )
        validate = getattr(options, "validate", None)
        if validate is not None:
            validate()
        return options


def keeps_typed_options(cls: Any, schema: type) -> bool:
    """Whether `cls` takes its options as one typed `schema` object (`options=`): a
    `Configurable` whose options are its nested `Options`, not (as for a subclass that
    declares its own keyword constructor) a schema derived from a signature."""
    return (
        isinstance(cls, type)
        and issubclass(cls, Configurable)
        and getattr(cls, "Options", None) is schema
    )


def check_min(name: str, value: int, minimum: int) -> None:
    """`ValueError` naming the setting `name` when `value` is below `minimum`."""
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_range(name: str, value: int, minimum: int, maximum: int, why: str = "") -> None:
    """`ValueError` naming the setting `name` when `value` is outside `[minimum, maximum]`
    (`why` says where the maximum comes from)."""
    check_min(name, value, minimum)
    if value > maximum:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be <= {maximum:,}{reason}, got {value:,}")


INT64_MAX = 2**63 - 1


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """`ValueError` naming the setting `name` when `value` is not one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
