"""What a training run reports and where: the `logging.*` settings, checked up front.

`TrainConfig.logging` holds a `LoggingConfig`; `metadist.train.log_sinks` checks the
places they name before a run is built, and `metadist.train.logging` writes to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metadist.options import check_choice, check_min

_WANDB_MODES = ("online", "offline", "disabled")
# what wandb refuses in a project name (`wandb.Settings.validate_project`), and in an
# entity its server (the entity, project and run id make a run's path and URL)
_WANDB_PROJECT_CHARACTERS = "/\\#?%:"
_WANDB_PROJECT_LENGTH = 128


@dataclass
class WandbConfig:
    """Weights & Biases tracking (rank 0 only).

    Attributes:
        mode: `offline` (default; sync later with `wandb sync`), `online` or `disabled`.
        project: wandb project name.
        entity: wandb entity (user or team); `None` for the default. wandb itself takes
            any string and only the server refuses a bad one, when the run is synced: a
            name that is empty or holds whitespace or a character of a path or URL is
            refused here instead.
        name: the wandb run's name; `None` for the experiment's name. A sweep names each
            trial's run (`trial-0003`).
        group: the wandb group of the run; `None` for none. A sweep puts its trials in
            one group (`sweep-<sweep dir name>`) unless its overrides give one.
        quiet: keep wandb's own console output out of the run's (wandb's `silent`, set
            for this run only; a `WANDB_SILENT` in the environment decides instead). False
            lets it print everything.
    """

    mode: str = "offline"
    project: str = "metadist"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    quiet: bool = True

    def validate(self) -> None:
        check_choice("logging.wandb.mode", self.mode, _WANDB_MODES)
        found = sorted({c for c in self.project if c in _WANDB_PROJECT_CHARACTERS})
        if found:
            raise ValueError(
                f"logging.wandb.project={self.project!r}: a wandb project name cannot "
                f"contain {' '.join(found)} (nor any of {' '.join(_WANDB_PROJECT_CHARACTERS)})"
            )
        if len(self.project) > _WANDB_PROJECT_LENGTH:
            raise ValueError(
                f"logging.wandb.project is {len(self.project)} characters long; wandb takes "
                f"at most {_WANDB_PROJECT_LENGTH}"
            )
        if self.entity is not None:
            _check_entity(self.entity)


def _check_entity(entity: str) -> None:
    """Refuses a wandb entity (a user or team name) that no wandb server accepts.

    Raises:
        ValueError: naming `logging.wandb.entity`, what is wrong and the remedy.
    """
    setting = f"logging.wandb.entity={entity!r}"
    if not entity.strip():
        raise ValueError(
            f"{setting}: a wandb entity is a user or team name, not empty or blank; set "
            "logging.wandb.entity=null for your default entity"
        )
    found = sorted({c for c in entity if c in _WANDB_PROJECT_CHARACTERS})
    if any(c.isspace() for c in entity):
        found.insert(0, "whitespace")
    if found:
        raise ValueError(
            f"{setting}: a wandb entity (a user or team name) holds no whitespace nor any "
            f"of {' '.join(_WANDB_PROJECT_CHARACTERS)}; found {' '.join(found)}"
        )


@dataclass
class LoggingConfig:
    """What rank 0 reports.

    Attributes:
        log_every: write a metrics line (JSON) every this many steps.
        progress: show progress (step, loss, tasks/s): a bar on a terminal, else a line
            on stderr every `progress_every` seconds.
        progress_every: seconds between two progress lines when stderr is not a terminal.
        tensorboard: also write the metrics as TensorBoard scalars to
            `<run_dir>/tensorboard` (needs the `tensorboard` extra); `metrics.jsonl` is
            written either way.
        wandb: Weights & Biases settings.
    """

    log_every: int = 10
    progress: bool = True
    progress_every: float = 30.0
    tensorboard: bool = False
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self) -> None:
        check_min("logging.log_every", self.log_every, 1)
        if not self.progress_every > 0:
            raise ValueError(f"logging.progress_every must be > 0, got {self.progress_every}")
        if self.tensorboard:
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                raise ValueError(
                    "logging.tensorboard=true needs the tensorboard package: "
                    "pip install 'metadist[tensorboard]'"
                )
        self.wandb.validate()
