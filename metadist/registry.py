"""One registry shape for every kind of component: samplers, models, learners, optimizers.

    SAMPLERS = Registry("sampler", TaskSampler)

    @SAMPLERS.register("my_sampler")
    class MySampler(TaskSampler): ...

    SAMPLERS.names()                                     # ["forecast", "my_sampler", ...]
    SAMPLERS.build("my_sampler", store, options={"lookback": 32})

A component's options are a dataclass: its nested `Options` class where it declares one
(subclasses extend their parent's), else the keyword parameters of its constructor (after
the positional arguments `build` passes). `build` reads the options into that dataclass
through `metadist.options.from_mapping`, so a misspelt key or a value of the wrong type is
one `ValueError` naming the field path (`sampler.options.lookbak`) and the closest valid
name, raised before anything is constructed. A component that keeps its options typed
(`metadist.options.Configurable`: the built-in samplers and models) then receives that
object itself (`cls(*args, options=typed)`) and keeps it as `self.options`; any other
(a constructor declaring keywords, as user components may) receives the options given as
keywords.
"""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from metadist.options import closest, from_mapping, keeps_typed_options, signature_options

T = TypeVar("T")


def options_schema(cls: type, positional: int = 0) -> type:
    """The dataclass of `cls`'s options.

    The nearest class in `cls`'s MRO that declares either decides: its nested `Options`
    dataclass, or the keyword parameters of its own constructor after `positional`
    positional arguments (a constructor taking only `**options` defers to its parent).
    """
    for klass in cls.__mro__:
        declared = klass.__dict__.get("Options")
        if isinstance(declared, type) and dataclasses.is_dataclass(declared):
            return declared
        init = klass.__dict__.get("__init__")
        if init is not None and _declares_keywords(init, 1 + positional):
            return signature_options(init, 1 + positional, f"{cls.__name__}Options")
    return signature_options(lambda: None, 0, f"{cls.__name__}Options")


def _declares_keywords(function: Any, skip: int) -> bool:
    parameters = list(inspect.signature(function).parameters.values())[skip:]
    return any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters)


class Registry(Generic[T]):
    """Named classes of one kind, with their option schemas.

    Args:
        kind: what the components are called in messages and config paths ("sampler":
            options live at `sampler.options`).
        base: the class every registered component must subclass, or None.
        positional: how many positional arguments `build` passes before the options
            (e.g. 2 for a model's shapes), or a function of the class giving it (1 for a
            sampler that reads a store, else 0); the constructor's keyword parameters
            after them are its options when it declares no `Options`.
        label: what one component is called in messages ("task sampler"); `kind` by
            default.
    """

    def __init__(
        self,
        kind: str,
        base: type | None = None,
        positional: int | Callable[[type], int] = 0,
        label: str | None = None,
    ) -> None:
        self.kind = kind
        self.label = label or kind
        self.base = base
        self.positional = positional
        self._classes: dict[str, T] = {}
        self._schemas: dict[str, type] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering a component (a class, or a factory function) under `name`
        (sets its `name` attribute).

        Raises:
            TypeError: `name` is not a string (the decorator written without its name,
                `@register_model` for `@register_model("name")`, is given the class).
            ValueError: `name` is empty.
        """
        decorator_name = "register_" + self.label.replace(" ", "_")
        if not isinstance(name, str):
            given = getattr(name, "__name__", None) or repr(name)
            raise TypeError(
                f"@{decorator_name} needs the name to register {given} under: write "
                f'@{decorator_name}("my_name"), not @{decorator_name} alone'
            )
        if not name.strip():
            raise ValueError(f'@{decorator_name}("{name}"): the name is empty')

        def decorator(cls: T) -> T:
            if self.base is not None and not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"registering {self.label} {name!r} needs a {self.base.__name__}")
            existing: Any = self._classes.get(name)
            qualname = getattr(cls, "__qualname__", repr(cls))
            if existing is not None and existing.__qualname__ != qualname:
                raise ValueError(
                    f"{self.label} {name!r} is already registered by "
                    f"{existing.__module__}.{existing.__qualname__}"
                )
            cls.name = name  # type: ignore[attr-defined]  # every component knows its name
            self._classes[name] = cls
            self._schemas.pop(name, None)
            return cls

        return decorator

    def names(self) -> list[str]:
        """Names of every registered component, sorted."""
        return sorted(self._classes)

    def get(self, name: str) -> T:
        """The class registered as `name`; `ValueError` with the closest name and the list."""
        try:
            return self._classes[name]
        except KeyError:
            guess = closest(str(name), self._classes)
            hint = f"; did you mean {guess!r}?" if guess else ""
            known = ", ".join(self.names()) or "none"
            raise ValueError(
                f"{self.kind}.name: unknown {self.label} {name!r}; registered: {known}{hint}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def options_schema(self, name: str) -> type:
        """The dataclass of `name`'s options (see `options_schema`)."""
        if name not in self._schemas:
            cls: Any = self.get(name)  # a class (a factory function has no options)
            positional = self.positional(cls) if callable(self.positional) else self.positional
            self._schemas[name] = options_schema(cls, positional)
        return self._schemas[name]

    def read_options(
        self, name: str, options: Mapping[str, Any] | None, path: str | None = None
    ) -> Any:
        """`name`'s options as its typed schema (`options_schema`), every value checked and
        coerced to its field's type, the missing ones at their defaults.

        Raises:
            ValueError: an unknown option (with the closest one) or a value of the wrong
                type, naming `path.<option>` (default path: `<kind>.options`).
        """
        where = path or f"{self.kind}.options"
        schema = self.options_schema(name)
        what = f"option of {self.label} {name!r}"
        return from_mapping(schema, dict(options or {}), where, what=what)

    def build(
        self,
        name: str,
        *args: Any,
        options: Any = None,
        path: str | None = None,
        **extra: Any,
    ) -> Any:
        """Constructs `name` from `options`, read first (`read_options`): a mapping, or
        the typed object `read_options` gave. A `Configurable` component receives the
        typed object (`cls(*args, options=typed, **extra)`); any other the options as
        keywords (those given, or every field of a typed object). Returns the instance
        (the wrappers of each kind give it its type).

        Raises:
            ValueError: an unknown name or option, or a value of the wrong type (nothing
                is constructed), or what the component's constructor raises.
        """
        cls: Any = self.get(name)
        schema = self.options_schema(name)
        if isinstance(options, schema):
            typed, given = options, [f.name for f in dataclasses.fields(schema)]
        else:
            typed, given = self.read_options(name, options, path), list(options or {})
        if keeps_typed_options(cls, schema):
            return cls(*args, options=typed, **extra)
        keywords = {key: getattr(typed, key) for key in given}
        try:
            return cls(*args, **keywords, **extra)
        except TypeError as error:
            # e.g. an option whose type the component does not annotate, refused by its
            # own arithmetic: one line naming the options and the place, not a traceback
            where = path or f"{self.kind}.options"
            frames = traceback.extract_tb(error.__traceback__)[1:]  # below this call
            if not frames:  # the call itself: an abstract method left out, a signature
                raise ValueError(
                    f"{self.label} {name!r} ({getattr(cls, '__name__', cls)}) could not be "
                    f"built from {where} {keywords}: {error}"
                ) from None
            at = f" at {frames[-1].filename}:{frames[-1].lineno}"
            raise ValueError(
                f"{self.label} {name!r} could not be built from {where} {keywords}: "
                f"{error}{at} (an option of the wrong type? annotate the options with "
                "their types to have them checked)"
            ) from None
