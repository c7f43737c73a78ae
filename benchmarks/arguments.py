"""The benchmark scripts' command lines: a bad argument is one line, found before any work.

Every script builds its parser with `script_parser(__doc__)`: the project's own `Parser` (its
errors are one line, no usage block, no abbreviated flags), described by the whole first
paragraph of the script's docstring. The types below check a value where argparse reads
it, so that a negative size, an output path that is a file, or a store that is not there
is refused before a panel is generated or a model trained:

    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--json", type=output_file)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from metadist.commands.parser import Parser


def script_parser(doc: str) -> Parser:
    """The parser of a script whose module docstring is `doc`."""
    first = doc.strip().split("\n\n")[0]
    return Parser(description=" ".join(first.split()))


def count(text: str) -> int:
    """A whole number of at least 1 (rounds, repeats, entities, threads, ...)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 1")
    return value


def non_negative(text: str) -> int:
    """A whole number of at least 0 (warm-up batches, steps, tasks that may be none)."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 0")
    return value


def positive(text: str) -> float:
    """A number above 0 (sizes in MB or GB, seconds)."""
    value = _number(text, float)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number > 0")
    return value


def directory(text: str) -> Path:
    """A directory to write in: there already, or to be made (not an existing file, and
    not below one)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    above = _nearest_existing(path)
    if not above.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {above} is a file, not a directory")
    return path


def output_file(text: str) -> Path:
    """A file to write (not a directory), its directory there or to be made."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file")
    directory(str(path.parent))
    return path


def store(text: str) -> Path:
    """A series store written by `metadist ingest`."""
    path = Path(text)
    if not (path / "metadata.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a series store (no metadata.json)")
    return path


def _number(text: str, kind: type) -> int | float:
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text} is not {what}") from None


def _nearest_existing(path: Path) -> Path:
    for above in (path, *path.absolute().parents):
        if above.exists():
            return above
    return Path("/")
