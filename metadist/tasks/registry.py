"""The sampler registry: `@register_task_sampler("name")`, `build_task_sampler`, names.

A sampler's options are its nested `Options` dataclass where it declares one (the
built-in samplers do, and receive and keep it typed: `metadist.options.Configurable`),
else the keyword parameters of its constructor (after the store, for a sampler that
reads one); they are read through `metadist.registry.Registry`, so
`sampler.options.lookbak=32` is one error naming the path and `lookback`.
"""

from __future__ import annotations

import inspect
from typing import Any

from metadist.registry import Registry
from metadist.tasks.base import TaskSampler


def check_takes_store(name: str, cls: type[TaskSampler]) -> None:
    """Raises one `ValueError` where a sampler left `needs_store` at `TaskSampler`'s
    default (True) but its constructor takes no store, so that it is not told to set a
    store it does not read, nor given one it cannot take.
    """
    try:
        inspect.signature(cls).bind_partial(None)
    except TypeError:
        raise ValueError(
            f"task sampler {name!r} ({cls.__name__}): needs_store is True (TaskSampler's "
            "default) but its constructor takes no store argument: set needs_store = False "
            "in the class if it reads no store, else take the store first "
            "(def __init__(self, store, *, ...))"
        ) from None
    except ValueError:
        return  # a signature inspect cannot read: the constructor call says what it finds


def _positional(cls: type[TaskSampler]) -> int:
    """Arguments before a sampler's options: the store where it reads one (checked that
    its constructor takes it: its options are the parameters after it)."""
    if not getattr(cls, "needs_store", True):
        return 0
    check_takes_store(getattr(cls, "name", cls.__name__), cls)
    return 1


SAMPLERS: Registry[type[TaskSampler]] = Registry(
    "sampler",
    TaskSampler,
    positional=_positional,
    label="task sampler",
)


def register_task_sampler(name: str):
    """Class decorator registering a `TaskSampler` under `name`.

    Registration happens when the defining module is imported; a training run selects a
    sampler of your own with `imports=[your_module] sampler.name=NAME`.

    Example:
        >>> @register_task_sampler("my_sampler")
        ... class MySampler(TaskSampler): ...
    """
    return SAMPLERS.register(name)


def registered_task_samplers() -> list[str]:
    """Names of all registered samplers, sorted."""
    return SAMPLERS.names()


def get_task_sampler(name: str) -> type[TaskSampler]:
    """The sampler class registered as `name`; `ValueError` naming the closest one."""
    return SAMPLERS.get(name)


def build_task_sampler(
    name: str,
    store: Any = None,
    *,
    path: str | None = None,
    options: Any = None,
    **keywords: Any,
) -> TaskSampler:
    """Builds the sampler registered as `name` with its options.

    Args:
        name: the registered name, e.g. "forecast", "nway_kshot", "sinusoid".
        store: the series store, for a sampler that reads one.
        path: where the options sit in the config, for messages (default
            `sampler.options`).
        options: the options as a mapping, or as the typed object
            `SAMPLERS.read_options` gives; or give them as `keywords` instead.
        **keywords: the options as keywords, instead of `options`.

    Raises:
        ValueError: unknown name, a sampler that needs a store given none, an unknown
            option (naming its path and the closest valid one) or a bad value.
        TypeError: both `options` and `keywords` given.
    """
    if options is not None and keywords:
        raise TypeError(f"build_task_sampler({name!r}): options or keywords, not both")
    given = keywords if options is None else options
    cls = SAMPLERS.get(name)
    if cls.needs_store:
        check_takes_store(name, cls)  # before telling it to set a store it cannot take
        if store is None:
            raise ValueError(f"task sampler {name!r} reads a series store: set data.store")
        return SAMPLERS.build(name, store, options=given, path=path)
    return SAMPLERS.build(name, options=given, path=path)
