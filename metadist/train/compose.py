"""Composing an experiment from the Hydra config tree in `experiments/`.

Hydra's compose API is used rather than `@hydra.main`: it changes no working directory
and creates no per-rank, time-stamped output directories, so every rank of a run agrees
on one run directory (`run_dir`, by default `runs/<experiment>`).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metadist.configs import CONFIG_GROUPS, find_experiments_dir, incomplete_tree
from metadist.configs import EXPERIMENTS_ENV as EXPERIMENTS_ENV
from metadist.options import unknown_key_error
from metadist.train.compose_errors import (
    check_experiment_header,
    check_no_hydra_settings,
    composition_error_line,
    yaml_error_line,
)
from metadist.train.config import TrainConfig, build_config


def compose_dict(overrides: list[str], config_dir: str | os.PathLike | None = None) -> dict:
    """The composed config as a plain dict, `experiment` set to the chosen experiment.

    An override of a component option the group's file does not list
    (`sampler.options.recent_splits=2`) is added rather than refused: the component's own
    option schema checks it when the component is built.

    Raises:
        ValueError: an override Hydra cannot apply (unknown group option, bad syntax), or
            one of a field that does not exist, naming it and the closest existing field.
    """
    directory = find_experiments_dir(config_dir)
    check_no_hydra_settings(overrides)
    check_experiment_header(directory, overrides)
    given = list(overrides)
    overrides = replace_options(overrides)
    choices, values = _compose_checked(directory, overrides)
    # A component named in place of its group's own (an experiment's `sampler: {name:
    # my_sampler}`, or `sampler.name=my_sampler`) does not inherit the group's options:
    # the group is dropped, keeping only what the experiment and the overrides set.
    foreign = [s for s in _OPTION_SECTIONS if _replaces_group(directory, choices, values, s)]
    if foreign:
        kept = [
            "++" + o.lstrip("+") if o.partition(".")[0].lstrip("+") in foreign else o
            for o in overrides
            if not (o.startswith("~") and o[1:].partition(".")[0] in foreign)
        ]
        choices, values = _compose_checked(directory, [*kept, *(f"~{s}" for s in foreign)])
        _keep_given_options(values, given, foreign)
    if isinstance(values.get("eval"), dict):
        given = [
            o.lstrip("+")[len("eval.") :] for o in overrides if o.lstrip("+").startswith("eval.")
        ]
        values["eval"].update(whole_eval_mappings(given, hydra=True))
    choice = choices.get("experiment")
    if choice and "experiment" not in values:
        values["experiment"] = choice
    if "experiment" not in values:
        names = sorted(p.stem for p in (directory / "experiment").glob("*.yaml"))
        raise ValueError(
            f"no experiment chosen: add experiment=NAME, one of {', '.join(names)} "
            f"(in {directory / 'experiment'})"
        )
    if values.get("run_dir") is None:
        values["run_dir"] = default_run_dir(str(values["experiment"]), overrides)
    return values


_GROUPS = CONFIG_GROUPS


def default_run_dir(experiment: str, overrides: list[str]) -> str:
    """`runs/<experiment>`, with `.<group>-<choice>` for every config group the command
    line chooses (`learner=metasgd` → `runs/sinusoid_maml.learner-metasgd`), so that two
    commands training different components never share (and refuse) one directory."""
    picked = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key in _GROUPS and value:
            picked.append(f"{key}-{value}")
    return str(Path("runs") / ".".join([experiment, *sorted(picked)]))


def _compose_checked(
    directory: Path, overrides: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`_compose`, with unknown component options and eval settings made additions and
    any other unknown key refused by name (`_handle_unknown_key`)."""
    for _ in range(len(overrides)):
        try:
            return _compose(directory, overrides)
        except _UnknownKey as unknown:
            overrides = _handle_unknown_key(directory, overrides, unknown.key)
    return _compose(directory, overrides)


def _replaces_group(
    directory: Path, choices: dict[str, Any], values: dict[str, Any], section: str
) -> bool:
    """Whether `section.name` names another component than the section's group file."""
    from omegaconf import DictConfig, OmegaConf

    chosen = choices.get(section)
    path = directory / section / f"{chosen}.yaml"
    if not chosen or not path.is_file():
        return False
    loaded = OmegaConf.load(path)
    own = loaded.get("name") if isinstance(loaded, DictConfig) else None
    composed = values.get(section)
    return bool(own) and isinstance(composed, dict) and composed.get("name") != own


class _UnknownKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


_UNKNOWN_KEY = re.compile(r"Could not override '([^']+)'")


# Hydra's error for a group option with no file, e.g. `experiment=synthetic_mam`
_MISSING_OPTION = re.compile(r"Could not find '([\w/]+)/([^'/]+)'")


def _missing_option(directory: Path, group: str, name: str, overrides: Sequence[str] = ()) -> str:
    """One line for `group=name` that names no config of `group`: the closest names and
    where the list is (Hydra's message spans the whole search path), and the config
    file whose defaults ask for it where the user's `overrides` do not."""
    options = sorted(p.stem for p in (directory / group).glob("*.yaml"))
    given = {o.lstrip("+~").lstrip("/").replace(" ", "") for o in overrides}
    source = "" if f"{group}={name}" in given else _defaults_naming(directory, group, name)
    incomplete = incomplete_tree(directory)
    if not options and incomplete:  # a part of a config tree, not a whole one
        return f"{group}={name}{source}: no such {group}: {incomplete}"
    close = difflib.get_close_matches(name, options, n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    listing = (
        "metadist experiments list"
        if group == "experiment"
        else f"{', '.join(options)}"
        if options
        else "none"
    )
    return f"{group}={name}{source}: no such {group}{hint} (the {group}s: {listing})"


def _defaults_naming(directory: Path, group: str, name: str) -> str:
    """`, in the defaults of FILE` for the first config file under `directory` whose
    defaults list has `group: name` (`override /group: name` among them), else ""."""
    line = re.compile(rf"^\s*-\s*(override\s+)?/?{re.escape(group)}\s*:\s*{re.escape(name)}\s*$")
    for path in sorted(directory.rglob("*.yaml")):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if any(line.match(row) for row in text.splitlines()):
            return f", in the defaults of {path}"
    return ""


def _compose(directory: Path, overrides: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(group choices, composed values)`; `_UnknownKey` for an override of a key the
    config does not have, `ValueError` for any other composition error."""
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    if not OmegaConf.has_resolver("add"):
        # `${add:${pretrain.steps},${trainer.meta_steps}}`: a budget derived from others
        # (the UCR recipes' eval.pretrain_steps), so an override of either keeps it matched
        OmegaConf.register_new_resolver("add", _add)
    try:
        with initialize_config_dir(str(directory), version_base=None, job_name="metadist"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        choices = dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        values: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except yaml.YAMLError as error:  # a config file's syntax: Hydra passes it on as it is
        raise ValueError(yaml_error_line(error)) from None
    except (HydraException, OmegaConfBaseException) as error:
        unknown = _UNKNOWN_KEY.search(str(error))
        if unknown and not unknown.group(1).startswith("~"):
            raise _UnknownKey(unknown.group(1)) from None
        missing = _MISSING_OPTION.search(str(error))
        if missing:
            raise ValueError(
                _missing_option(directory, missing.group(1), missing.group(2), overrides)
            ) from None
        line = composition_error_line(error)
        if line is not None:
            raise ValueError(line) from None
        said = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise ValueError(f"cannot compose the experiment config: {said}") from None
    return choices, values


def _add(*terms: Any) -> Any:
    """The `add` resolver: the sum of numbers (one that is not is named, not summed)."""
    for term in terms:
        if isinstance(term, bool) or not isinstance(term, (int, float)):
            raise ValueError(f"${{add:...}} sums numbers; {term!r} is not one")
    return sum(terms)


def _handle_unknown_key(directory: Path, overrides: list[str], key: str) -> list[str]:
    """The overrides with `key` made an addition, when it is a component option or an
    evaluation setting (whose schema then checks it, naming the closest valid name); else
    `ValueError` naming `key` and the closest existing field."""
    index = next(
        (i for i, o in enumerate(overrides) if o.partition("=")[0].lstrip("+~") == key), None
    )
    parts = key.split(".")
    component_option = len(parts) >= 3 and parts[0] in _OPTION_SECTIONS and parts[1] == "options"
    # eval.* is typed by the evaluation layer (all of `EvalOptions`, not only the keys
    # its group file lists)
    eval_setting = len(parts) >= 2 and parts[0] == "eval"
    if index is not None and (component_option or eval_setting):
        return [*overrides[:index], "+" + overrides[index].lstrip("+"), *overrides[index + 1 :]]
    selections = [
        o
        for i, o in enumerate(overrides)
        if i != index and "." not in o.partition("=")[0] and o[:1] not in "+~"
    ]
    try:
        _, base = _compose(directory, selections)
    except (_UnknownKey, ValueError):
        base = {}
    parent: Any = base
    for part in parts[:-1]:
        parent = parent.get(part) if isinstance(parent, dict) else None
    if isinstance(parent, dict):
        raise unknown_key_error(key, parts[-1], [str(k) for k in parent], "field")
    raise ValueError(f"{key}: unknown field ({'.'.join(parts[:-1])} is not a section)")


_OPTION_SECTIONS = ("sampler", "model", "learner")
# evaluation mappings an override gives whole (Hydra and OmegaConf would merge them into
# the experiment's): the seasonal periods by stratum or label are a store's own
WHOLE_EVAL_MAPPINGS = ("seasonal_period",)


def whole_eval_mappings(dotlist: Sequence[str], hydra: bool = False) -> dict[str, Any]:
    """`{name: mapping}` of each `NAME={...}` of `dotlist` (evaluation settings, `eval.`
    left out) whose NAME is one of `WHOLE_EVAL_MAPPINGS`: the mapping as given, to put in
    place of its merge with the experiment's (whose strata then stayed, and were listed
    as the store's). Read as the overrides around it are: by Hydra's grammar (`hydra`,
    the training's: `{a:12}`), else as OmegaConf's dotlist (an evaluation's)."""
    from omegaconf import OmegaConf

    out: dict[str, Any] = {}
    for item in dotlist:
        key, sep, value = item.lstrip("+").partition("=")
        if not (sep and key in WHOLE_EVAL_MAPPINGS and value.lstrip().startswith("{")):
            continue
        if hydra:
            from hydra.core.override_parser.overrides_parser import OverridesParser

            (parsed,) = OverridesParser.create().parse_overrides([f"{key}={value}"])
            out[key] = parsed.value()
        else:
            read = OmegaConf.to_container(OmegaConf.from_dotlist([f"{key}={value}"]))
            assert isinstance(read, dict)  # a dotlist makes a mapping
            out[key] = read[key]
    return out


def _keep_given_options(values: dict[str, Any], overrides: list[str], sections: list[str]) -> None:
    """`X.options={...}` replaces the whole mapping for a component named in place of its
    group's too: the experiment's own `X.options` (Hydra merged the given mapping into
    them) give way to the keys given, and to those set one by one (`X.options.k=v`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for section in sections:
        whole = [o for o in overrides if o.partition("=")[0].lstrip("+") == f"{section}.options"]
        options = values.get(section, {}).get("options")
        if not whole or not isinstance(options, dict):
            continue
        given = parser.parse_override(whole[-1].lstrip("+")).value()
        keys = set(given) if isinstance(given, dict) else set()
        prefix = f"{section}.options."
        keys |= {
            o.partition("=")[0].lstrip("+")[len(prefix) :].partition(".")[0]
            for o in overrides
            if o.lstrip("+").startswith(prefix)
        }
        values[section]["options"] = {k: v for k, v in options.items() if k in keys}


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
