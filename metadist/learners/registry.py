"""The learner registry: `@register_learner("name")`, `build_learner`, `registered_learners`.

A learner's options are its `Options` dataclass (subclasses extend their parent's), read
through `metadist.registry.Registry`, so `learner.options.inner_lrr=0.1` is one error
naming the path and `inner_lr`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from metadist.learners.base import Learner
from metadist.registry import Registry

LEARNERS: Registry[type[Learner]] = Registry("learner", Learner, positional=1)


def register_learner(name: str):
    """Class decorator registering a `Learner` subclass under `name`.

    Example:
        >>> @register_learner("my_learner")
        ... class MyLearner(InnerLoopLearner): ...
    """
    return LEARNERS.register(name)


def registered_learners() -> list[str]:
    """Names of all registered learners, sorted."""
    return LEARNERS.names()


def get_learner(name: str) -> type[Learner]:
    """The learner class registered as `name`; `ValueError` naming the closest one."""
    return LEARNERS.get(name)


# Names that are a registered learner with options set, as the Hydra learner configs of the
# same names are (experiments/learner/fomaml.yaml: `name: maml`, `first_order: true`), so
# that `learner=NAME` and `build_learner("NAME", ...)` take the same names.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {"fomaml": ("maml", {"first_order": True})}


def build_learner(name: str, model: nn.Module, **options: Any) -> Learner:
    """Builds the learner registered as `name` around `model`; a name of `PRESETS`
    (`"fomaml"`) builds its learner (`maml`) with its options set (`first_order=True`).

    Raises:
        ValueError: unknown learner, an option the learner does not have (naming
            `learner.options.<key>` and the closest option), or a bad value (also an
            option of a preset given another value).
    """
    if name in PRESETS:
        base, preset = PRESETS[name]
        for key, value in preset.items():
            if options.setdefault(key, value) != value:
                raise ValueError(
                    f"learner {name!r} is {base!r} with {key}={value!r}, but {key}="
                    f"{options[key]!r} was given; build {base!r} for that"
                )
        name = base
    return LEARNERS.build(name, model, options=options)
