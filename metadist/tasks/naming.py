"""How a message names a sampler: the class the user wrote, and its registered name.

The registry sets `name` on the class it registers, so a class of one's own derived from a
built-in sampler inherits the built-in's name; a message reading that name alone would
name the built-in, not the class that failed.
"""

from __future__ import annotations

from typing import Any


def sampler_label(sampler: Any) -> str:
    """`sampler 'sinusoid' (SinusoidSampler)` for a registered class; a class that is not
    registered itself is named by its class, with the registered one it derives from:
    `sampler Local (derived from 'sinusoid')`. A sampler rebuilt from a run's
    `inference.json` is named as recorded (its `recorded_class`)."""
    cls = type(sampler)
    recorded = getattr(sampler, "recorded_class", None)
    if recorded:
        return f"sampler {getattr(sampler, 'name', '') or '?'!r} ({recorded})"
    own = vars(cls).get("name")  # set by the registry on the class it registered
    if isinstance(own, str) and own:
        return f"sampler {own!r} ({cls.__name__})"
    inherited = getattr(sampler, "name", "")
    if isinstance(inherited, str) and inherited:
        return f"sampler {cls.__name__} (derived from {inherited!r})"
    return f"sampler {cls.__name__}"
