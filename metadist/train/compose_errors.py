"""What composing an experiment refuses, in one line naming the override, file or key.

`metadist.train.compose` composes with Hydra; the checks here run before it (an
override of Hydra's own settings, an experiment file that is not `# @package _global_`)
or read its errors (an override Hydra cannot parse, a YAML syntax error, an
interpolation that does not resolve) into one line a user can act on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

# the settings of a Hydra job's own output directories: the run directory is `run_dir`
_OUTPUT_DIRS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.runtime.output_dir")


def check_no_hydra_settings(overrides: Sequence[str]) -> None:
    """Refuses an override of Hydra's own settings (`hydra.run.dir=...`,
    `hydra/job_logging=...`): the config is composed without a Hydra job, so they would
    change nothing (`hydra.run.dir` would leave the run in `runs/<experiment>`).

    Raises:
        ValueError: naming the override and, for an output directory, `run_dir`.
    """
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key != "hydra" and not key.startswith(("hydra.", "hydra/")):
            continue
        if key in _OUTPUT_DIRS:
            raise ValueError(
                f"{override}: metadist makes no Hydra output directory; choose the run "
                f"directory with run_dir={value or 'PATH'}"
            )
        raise ValueError(
            f"{override}: Hydra's own settings (hydra.*) do not apply, since metadist "
            "composes the config without a Hydra job; set the experiment's own keys "
            "(run_dir=PATH for the run directory)"
        )


def check_experiment_header(directory: Path, overrides: Sequence[str]) -> None:
    """Refuses the chosen experiment file (`experiment=NAME`) where its header does not
    say `# @package _global_`: Hydra would put all its keys under `experiment.`, and the
    message would be about those keys, not the file.

    Raises:
        ValueError: naming the file and the line it needs first.
    """
    from hydra.plugins.config_source import ConfigSource

    names = [
        o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == "experiment"
    ]
    if not names or not names[-1]:
        return
    path = directory / "experiment" / f"{names[-1]}.yaml"
    try:
        with open(path, encoding="utf-8") as file:
            header_text = file.read(512)  # what Hydra reads its header from
    except (OSError, UnicodeDecodeError):
        return  # no such file, or not one Hydra reads: its own error says so
    try:
        package = ConfigSource._get_header_dict(header_text).get("package")
    except ValueError as error:
        raise ValueError(f"{path}: a bad header line: {error}") from None
    if package is None:
        raise ValueError(
            f"{path}: an experiment file must begin with the line `# @package _global_` "
            "(before any other line, comments included); without it Hydra reads its "
            "settings as keys under experiment."
        )


def yaml_error_line(error: Exception) -> str:
    """A YAML syntax error of a config file as `FILE, line L, column C: ...`."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    what = f"{problem} ({context})" if context else str(problem)
    if mark is None:
        return f"a config file is not valid YAML: {what}"
    return f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {what}"


def composition_error_line(error: Exception) -> str | None:
    """One line for an override Hydra cannot parse or an interpolation that does not
    resolve, naming the override or key; `None` for another error."""
    from hydra.errors import OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(error, OverrideParseException):
        return _parse_error_line(error.override, error.message)
    if isinstance(error, OmegaConfBaseException) and getattr(error, "full_key", None):
        return _interpolation_error_line(str(error.full_key), str(getattr(error, "msg", error)))
    return None


def _parse_error_line(override: str, message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # Hydra's first line may repeat the override; its link to the grammar is left out
    said = next((x for x in lines if not x.startswith(("Error parsing", "See "))), message)
    key, sep, value = override.partition("=")
    remedy = "see `metadist train --help` for the override syntax"
    quotable = value and "'" not in value and '"' not in value and value[0] not in "[{"
    if sep and _KEY.fullmatch(key) and quotable:
        # a value holding '=', spaces, brackets or other characters of Hydra's grammar
        # Hydra's double quotes inside the shell's single ones: a `$` stays as typed
        remedy = f"quote the value for Hydra, inside the shell's quotes: '{key}=\"{value}\"'"
    return f"{override}: not an override Hydra can read ({said}); {remedy}"


# a key as an override names it (`+data.store`, `sampler.options.lookback`)
_KEY = re.compile(r"[+~]{0,2}[\w@/-]+(\.[\w@/-]+)*")


_ENV_UNSET = re.compile(r"Environment variable '([^']+)' not found")


def _interpolation_error_line(key: str, message: str) -> str:
    said = message.splitlines()[0].strip()
    unset = _ENV_UNSET.search(said)
    if unset:
        name = unset.group(1)
        return (
            f"{key}: the environment variable {name} is not set (${{oc.env:{name}}}); set it, "
            f"or give a default: ${{oc.env:{name},VALUE}}"
        )
    return f"{key}: {said}"
