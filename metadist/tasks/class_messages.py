"""How the N-way K-shot sampler names classes and options in its messages."""

from __future__ import annotations


def sized_classes(classes: dict[str, int]) -> str:
    """`a (3 entities), b (1 entity)`: classes named with their sizes, for messages."""
    return ", ".join(
        f"{name} ({count} entit{'ies' if count != 1 else 'y'})" for name, count in classes.items()
    )


def evaluation_options(error: ValueError) -> str:
    """`error`'s message with the evaluation's sampler options as the lever to change:
    an evaluation reads `eval.sampler_options`, never the run's `sampler.options`."""
    return str(error).replace("sampler.options.", "eval.sampler_options.")
