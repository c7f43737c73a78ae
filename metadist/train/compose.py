"""Composing an experiment from the Hydra config tree in `experiments/`.

Hydra's compose API is used rather than `@hydra.main`: it changes no working directory
and creates no per-rank, time-stamped output directories, so every rank of a run agrees
on one run directory (`run_dir`, by default `runs/<experiment>`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from metadist.train.config import TrainConfig, build_config

EXPERIMENTS_ENV = "METADIST_EXPERIMENTS_DIR"


def find_experiments_dir(config_dir: str | os.PathLike | None = None) -> Path:
    """The directory holding `config.yaml` and the config groups.

    Looked up in order: `config_dir`; the `METADIST_EXPERIMENTS_DIR` environment variable;
    `./experiments` in the working directory; `experiments/` next to the `metadist`
    package (a source checkout or an editable install).

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
        package_root = Path(__file__).resolve().parents[2]
        candidates.append(("source checkout", package_root / "experiments"))
    for _, path in candidates:
        if (path / "config.yaml").is_file():
            return path.resolve()
    tried = "; ".join(f"{where}: {path}" for where, path in candidates)
    raise FileNotFoundError(
        f"no experiments directory with a config.yaml found ({tried}); pass "
        f"--config-dir PATH or set {EXPERIMENTS_ENV}"
    )


def compose_dict(overrides: list[str], config_dir: str | os.PathLike | None = None) -> dict:
    """The composed config as a plain dict, `experiment` set to the chosen experiment.

    Raises:
        ValueError: an override Hydra cannot apply (unknown group option, bad syntax, a key
            that does not exist), with Hydra's explanation.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    directory = find_experiments_dir(config_dir)
    try:
        with initialize_config_dir(str(directory), version_base=None, job_name="metadist"):
            cfg = compose("config", overrides=replace_options(overrides), return_hydra_config=True)
        choice = cfg.hydra.runtime.choices.get("experiment")
        with open_dict(cfg):
            del cfg["hydra"]
        values: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise ValueError(f"cannot compose the experiment config: {error}") from None
    if choice and "experiment" not in values:
        values["experiment"] = choice
    if "experiment" not in values:
        names = sorted(p.stem for p in (directory / "experiment").glob("*.yaml"))
        raise ValueError(
            f"no experiment chosen: add experiment=NAME, one of {', '.join(names)} "
            f"(in {directory / 'experiment'})"
        )
    return values


_OPTION_SECTIONS = ("sampler", "model", "learner")


def replace_options(overrides: list[str]) -> list[str]:
    """Lets `sampler.options={...}` (also model/learner) replace the whole mapping.

    Hydra merges a mapping into the existing one and refuses some such overrides, so
    `X.options={a: 1}` becomes `~X.options` followed by `+X.options={a: 1}`: the
    component gets exactly the options given (what a custom sampler needs in place of
    the default sampler's options).
    """
    out: list[str] = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key in {f"{s}.options" for s in _OPTION_SECTIONS} and value.startswith("{"):
            out += [f"~{key}", f"+{key}={value}"]
        else:
            out.append(override)
    return out


def load_config(
    overrides: list[str],
    config_dir: str | os.PathLike | None = None,
    *,
    world_size: int | None = None,
) -> TrainConfig:
    """Composes `experiments/` with `overrides` (e.g. `["experiment=sinusoid_maml"]`).

    Raises:
        ValueError: a bad override, field, value or combination, naming the field.
        FileNotFoundError: no experiments directory, or `data.store` missing.
    """
    return build_config(compose_dict(overrides, config_dir), world_size=world_size)
