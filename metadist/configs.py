"""Where the experiment configs are, and which experiments ship.

This module imports nothing heavy (no torch, no Hydra), so `metadist experiments list`
answers at once. `metadist.train.compose` composes configs from the directory found here.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from metadist.durable import make_directory_beside
from metadist.options import closest

EXPERIMENTS_ENV = "METADIST_EXPERIMENTS_DIR"
PACKAGE = Path(__file__).resolve().parent
# the config groups of an experiments directory, beside its config.yaml and experiment/
CONFIG_GROUPS = ("data", "sampler", "model", "learner", "optimizer", "trainer", "logging", "eval")


def find_experiments_dir(config_dir: str | os.PathLike | None = None) -> Path:
    """The directory holding `config.yaml` and the config groups.

    Looked up in order: `config_dir`; the `METADIST_EXPERIMENTS_DIR` environment variable;
    `./experiments` in the working directory; `experiments/` next to the `metadist`
    package (a source checkout or an editable install); the configs shipped in the
    installed package (`metadist/_experiments`, copied from `experiments/` when the wheel
    is built).

    Raises:
        FileNotFoundError: none of those holds a `config.yaml`; the message lists them.
    """
    candidates: list[tuple[str, Path]] = []
    if config_dir is not None:
        candidates.append(("--config-dir", Path(config_dir)))
    elif os.environ.get(EXPERIMENTS_ENV):
        candidates.append((EXPERIMENTS_ENV, Path(os.environ[EXPERIMENTS_ENV])))
    else:
        candidates.append(("working directory", Path.cwd() / "experiments"))
        candidates.append(("source checkout", PACKAGE.parent / "experiments"))
        candidates.append(("installed package", PACKAGE / "_experiments"))
    for _, path in candidates:
        if (path / "config.yaml").is_file():
            return path.resolve()
    tried = "; ".join(f"{where}: {path}" for where, path in candidates)
    (_, path), *_ = candidates
    if len(candidates) > 1:
        remedy = f"pass --config-dir PATH or set {EXPERIMENTS_ENV}"
    elif path.is_dir():  # the shipped configs are not looked at: it is the only place
        remedy = incomplete_tree(path) or ""
    else:
        remedy = f"{path} is not a directory; {_WHOLE_TREE}"
    raise FileNotFoundError(
        f"no experiments directory with a config.yaml found ({tried}); {remedy}"
    )


_WHOLE_TREE = (
    "an experiments directory holds the whole config tree (`metadist experiments copy NAME "
    "DEST` copies the shipped one to edit)"
)


def incomplete_tree(directory: Path) -> str | None:
    """`DIR lacks config.yaml, model/, ...: ...` (what a config tree needs and `directory`
    does not hold: a group is missing where it holds no config), and how to get a whole
    one; None where nothing is missing."""
    missing = [] if (directory / "config.yaml").is_file() else ["config.yaml"]
    groups = ("experiment", *CONFIG_GROUPS)
    missing += [f"{g}/" for g in groups if not any((directory / g).glob("*.yaml"))]
    if not missing:
        return None
    return f"{directory} lacks {', '.join(missing)}: {_WHOLE_TREE}"


@dataclass(frozen=True)
class Experiment:
    """One experiment file (`experiment/NAME.yaml`) and the first line of its comment."""

    name: str
    path: Path
    summary: str


def list_experiments(experiments_dir: Path) -> list[Experiment]:
    """The experiments under `experiments_dir/experiment`, sorted by name."""
    found = []
    for path in sorted((experiments_dir / "experiment").glob("*.yaml")):
        found.append(Experiment(path.stem, path, _summary(path)))
    return found


def _summary(path: Path, width: int | None = None) -> str:
    """The first sentence of the file's leading comment (after `# @package`), whole or
    cut to `width`."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text.startswith("@package"):
            lines.append(text)
    sentence = re.split(r"(?<=[a-z0-9)]{3}[.?!])\s+(?=[A-Z])", " ".join(lines), maxsplit=1)[
        0
    ].rstrip(".")
    if width is None or len(sentence) <= width:
        return sentence
    return sentence[: width - 1].rstrip() + "…"


def copy_experiments(source: Path, destination: Path, name: str | None = None) -> Path:
    """Copy the whole config tree at `source` to `destination`, a new directory.

    The copy is complete (`config.yaml` and every group), so
    `metadist train --config-dir DESTINATION experiment=NAME` runs it after any edit.

    Args:
        source: an experiments directory (`find_experiments_dir()`).
        destination: where to copy; must not exist yet.
        name: an experiment that must exist in `source` (checked before copying).

    Returns:
        The path of the experiment file in the copy (`name` given), else `destination`.

    Raises:
        ValueError: `name` is not a shipped experiment (with the closest name).
        FileExistsError: `destination` exists (nothing is overwritten).
    """
    names = [experiment.name for experiment in list_experiments(source)]
    if name is not None and name not in names:
        guess = closest(name, names)
        hint = f"; did you mean {guess!r}?" if guess else ""
        raise ValueError(f"no experiment named {name!r}{hint} (see `metadist experiments list`)")
    if destination.exists() or destination.is_symlink():
        raise FileExistsError(f"{destination} exists; choose a new directory (nothing copied)")
    staging = destination.with_name(f".{destination.name}.copying-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        make_directory_beside(staging, destination)  # names DESTINATION, not the staging
        shutil.copytree(
            source, staging, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
        )
        staging.rename(destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return destination / "experiment" / f"{name}.yaml" if name else destination
