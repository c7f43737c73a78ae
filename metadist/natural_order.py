"""Names in the order a reader expects: runs of digits as numbers (`2` before `10`,
`k2` before `k10`), for the lists of classes a report shows."""

from __future__ import annotations

import re
from typing import Any

_DIGITS = re.compile(r"([0-9]+)")


def natural_key(name: Any) -> tuple[tuple[str | int, ...], str]:
    """The sort key of `str(name)`: its text and its runs of digits in turn, the digits
    compared as numbers (then the text itself, so that `01` and `1` keep one order)."""
    text = str(name)
    parts = _DIGITS.split(text)  # text, digits, text, ...: the same kinds line up
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text
