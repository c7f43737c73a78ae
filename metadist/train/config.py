"""Typed training configuration, built from a Hydra composition and validated up front.

Hydra (`experiments/`) selects and overrides; these dataclasses say what a field is and
what values it may take. `build_config` turns a plain nested dict into a `TrainConfig`
and raises `ValueError` naming the first bad field (`trainer.meta_batch_size`, ...),
before any process group forms, so that every rank of a bad run stops at once with the
same message.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metadist.data import StratifiedTaskPartitioner
from metadist.data.splits import SPLIT_BY, STRATIFY_BY, build_partitioner
from metadist.options import (
    INT64_MAX,
    check_choice,
    check_min,
    check_range,
    from_mapping,
    to_plain,
)
from metadist.registry import Registry
from metadist.store import SeriesStore
from metadist.tasks import TaskSampler
from metadist.train.imports import import_modules  # re-exported: it lives on its own
from metadist.train.logging_config import LoggingConfig
from metadist.train.optim import OptimizerConfig  # re-exported: it lives with the optimizers
from metadist.train.pretrain import PretrainConfig
from metadist.train.selection import SelectionConfig

_DEVICES = ("auto", "cpu", "cuda")
_BACKENDS = ("auto", "gloo", "nccl")
# A bound far above any real run, so that a typo (1e20) is refused, not started.
MAX_META_STEPS = 10**12
# data.num_workers: DataLoader worker processes per rank
MAX_WORKERS = 256
_PRECISIONS = ("fp32", "bf16")
_GPU_INDEX = re.compile(r"cuda:\d+")


@dataclass
class DataConfig:
    """Where tasks come from and how they are split and loaded.

    Attributes:
        store: path of a series store directory; `None` for samplers that need no store
            (sinusoid).
        fractions: meta-train / meta-val / meta-test shares of the units, each in [0, 1],
            summing to 1.
        pinned_test_units: unit indices always placed in meta-test (with a class split,
            their whole classes).
        split_by: the meta-split protocol (`metadist.data.splits`): `unit` (null, the
            default) or `entity` deal units or whole entities to the splits, stratified by
            `stratify_by`; `label` or `stratum` deal whole classes, so meta-train, meta-val
            and meta-test hold disjoint classes (the standard few-shot protocol).
        stratify_by: what unit and entity splits are stratified by: `stratum` (null, the
            default), `label` or `none`.
        verify_store: recompute the store's checksums before training or evaluating on it
            (`metadist.store.identity.check_store_integrity`), so damaged bytes stop the run.
        num_workers: `DataLoader` worker processes per rank.
        pin_memory: page-locked host batches; `None` turns it on when training on a GPU.
        prefetch_factor: batches each worker prepares ahead; `None` keeps torch's default.
        persistent_workers: keep workers alive between epochs.
        order: epoch order of the tasks, "random" or "blocked" (for a store larger than
            the memory free for the page cache: see `BatchMetaDataLoader`).
        block_bytes: with `order: blocked`, bytes of the store per block.
        window_blocks: with `order: blocked`, blocks whose tasks are mixed at a time.
        read_ahead: batches ahead whose store rows the kernel is asked to read; `None`
            is 4 with `order: blocked`, and with `order: random` 4 when the store is
            larger than the memory available, else 0.
        release: with `order: blocked`, drop each block from the page cache after use.
    """

    store: str | None = None
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    pinned_test_units: list[int] | None = None
    split_by: str | None = None
    stratify_by: str | None = None
    verify_store: bool = True
    num_workers: int = 0
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    order: str = "random"
    block_bytes: int = 32 << 20
    window_blocks: int = 16
    read_ahead: int | None = None
    release: bool = False

    def partitioner(
        self, sampler: TaskSampler, store: SeriesStore | None, seed: int
    ) -> StratifiedTaskPartitioner:
        """The run's `StratifiedTaskPartitioner` of `sampler`'s units (see
        `metadist.data.splits.build_partitioner`)."""
        return build_partitioner(
            sampler,
            store,
            seed=seed,
            fractions=tuple(self.fractions),
            split_by=self.split_by or "unit",
            stratify_by=self.stratify_by or "stratum",
            pinned_test_units=self.pinned_test_units,
        )

    def validate(self) -> None:
        if len(self.fractions) != 3:
            raise ValueError(
                f"data.fractions needs 3 shares (train, val, test), got {list(self.fractions)}"
            )
        if any(f < 0 or f > 1 for f in self.fractions) or abs(sum(self.fractions) - 1) > 1e-6:
            raise ValueError(
                f"data.fractions must be shares in [0, 1] summing to 1, got {list(self.fractions)}"
            )
        if self.fractions[0] <= 0:
            raise ValueError("data.fractions: the meta-train share must be > 0")
        if self.split_by is not None and self.split_by not in SPLIT_BY:
            raise ValueError(
                f"data.split_by must be one of {', '.join(SPLIT_BY)} or null, got {self.split_by!r}"
            )
        if self.stratify_by is not None and self.stratify_by not in STRATIFY_BY:
            raise ValueError(
                f"data.stratify_by must be one of {', '.join(STRATIFY_BY)} or null, got "
                f"{self.stratify_by!r}"
            )
        if self.split_by in ("label", "stratum") and self.stratify_by not in (None, "none"):
            raise ValueError(
                f"data.stratify_by={self.stratify_by} does not apply to data.split_by="
                f"{self.split_by}: whole classes are split, not stratified; leave it null"
            )
        # worker processes per rank: a fixed bound (a config is often checked on another
        # machine than the one it trains on); 100,000 forked until the machine stalled
        check_range("data.num_workers", self.num_workers, 0, MAX_WORKERS, "processes per rank")
        if self.prefetch_factor is not None:
            # torch queues prefetch_factor x num_workers indices before the first batch:
            # 10^9 of them took minutes before the first step
            check_range("data.prefetch_factor", self.prefetch_factor, 1, 1024, "batches ahead")
            if self.num_workers == 0:
                raise ValueError("data.prefetch_factor needs data.num_workers > 0")
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("data.persistent_workers needs data.num_workers > 0")
        check_choice("data.order", self.order, ("random", "blocked"))
        check_range("data.block_bytes", self.block_bytes, 1, INT64_MAX, "a 64-bit byte count")
        check_range("data.window_blocks", self.window_blocks, 1, INT64_MAX, "an int64")
        if self.read_ahead is not None:
            check_min("data.read_ahead", self.read_ahead, 0)
        if self.release and self.order != "blocked":
            raise ValueError("data.release needs data.order=blocked")
        if self.store is not None and not Path(self.store).is_dir():
            raise FileNotFoundError(f"data.store: no series store at {self.store!r}{_BUILD_ONE}")


# how to make the store a training needs, which a trained run's missing store is not
_BUILD_ONE = (
    " (build one with `metadist ingest` from your own Parquet files, from "
    "`metadist synth OUT --entities 600 --length-range 400 1200` for the synthetic "
    "panel, or from `metadist datasets` "
    "for the competition and UCR/UEA sets; `metadist demo --out runs/demo` builds "
    "runs/demo/data/store)"
)


def store_not_found(error: FileNotFoundError) -> str:
    """The message of `data.store`'s missing store without how to build one: a trained
    run's store was built, and is elsewhere."""
    return str(error).replace(_BUILD_ONE, "")


@dataclass
class ComponentConfig:
    """A registered component chosen by name, with its options.

    Attributes:
        name: the registered name.
        options: the options as composed: the plain mapping the config files and the
            overrides give, and the run's saved config holds.

    `typed_options` (an attribute, not a field: it is neither composed nor saved) is
    `None` until `read_options` checks the options against the component's schema; it
    then holds them typed (the component's `Options`), the object the component is
    built from.
    """

    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.typed_options: Any = None

    def read_options(self, registry: Registry) -> Any:
        """The options read into `registry`'s schema of `name`, kept as `typed_options`.

        Raises:
            ValueError: an unknown name or option, or a value of the wrong type, naming
                `<kind>.options.<key>` and the closest valid name.
        """
        self.typed_options = registry.read_options(self.name, self.options)
        return self.typed_options


@dataclass
class ModelConfig(ComponentConfig):
    """The model: a registered name, its options and, optionally, its output shape.

    Attributes:
        output_shape: one prediction's shape; `None` takes it from the tasks (the target
            shape `(H, T)`, or one logit per class). Set it for embedding networks, e.g.
            `[64]` for Prototypical Networks.
    """

    output_shape: list[int] | None = None

    def validate(self) -> None:
        if self.output_shape is not None and (
            not self.output_shape or any(d < 1 for d in self.output_shape)
        ):
            raise ValueError(
                f"model.output_shape must be null or positive sizes, got {self.output_shape}"
            )


@dataclass
class TrainerConfig:
    """The meta-training schedule.

    Attributes:
        meta_steps: outer-loop steps in the whole run.
        meta_batch_size: tasks per meta-step over all ranks (the global meta-batch); each
            rank takes `meta_batch_size / world_size`.
        fit_meta_batch: where a rank's meta-train split holds fewer tasks per epoch than
            its share of the meta-batch (a panel of a few series), train in batches of
            the tasks it holds, with a note, instead of stopping (recipes meant for any
            data set, `competition*`); false: stop, saying what to change.
        seed: seeds the model initialisation, the data split and the task stream.
        checkpoint_every: write a checkpoint every this many steps (and at the end).
        keep_checkpoints: how many recent checkpoints to keep in the run directory.
        eval_every: evaluate on meta-val every this many steps; 0 turns it off.
        eval_batches: meta-val batches per evaluation (the same tasks every time).
        device: `auto` (a GPU per rank when there is one), `cpu`, `cuda`, or `cuda:N` (every
            rank on GPU N, e.g. two gloo ranks sharing one GPU).
        backend: process-group backend: `auto` (NCCL on GPU, gloo on CPU), `gloo`, `nccl`.
        find_unused_parameters: passed to DistributedDataParallel.
        num_threads: CPU threads for torch's intra-op parallelism in each process; `None`
            leaves torch's choice (all cores, or `OMP_NUM_THREADS` when set, as torchrun
            does). 1 is usually fastest for small meta-learning models on CPU, whose
            many tiny ops gain nothing from threads.
        check_every: how often (in meta-steps) the host reads the step guard: whether a
            meta-loss or meta-gradient was NaN/inf on any rank, and whether any rank was
            signalled to stop. Between reads a non-finite step is still never applied (the
            update is masked on the device and every later one too), and the run stops
            with `NonFiniteLossError` naming that step at the next read. `None`: 1 on CPU
            (where reading costs nothing), 16 on GPU (a read is a host sync). Metrics
            records, evaluation and checkpoints always read first.
        compile: run the meta-step's forward and backward through `torch.compile`
            (`mode="reduce-overhead"` on GPU, Inductor's C++ wrapper on CPU; the first
            step eager); where it cannot compile (a double backward through a model
            without a written-out backward, e.g. second-order MAML of the TCN),
            one line says so and the run continues eagerly.
        precision: `fp32`, or `bf16` to run the meta-step's forward under bfloat16
            autocast (parameters and optimizer state stay fp32).
    """

    meta_steps: int = 1000
    meta_batch_size: int = 25
    fit_meta_batch: bool = False
    seed: int = 0
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    eval_every: int = 0
    eval_batches: int = 4
    device: str = "auto"
    backend: str = "auto"
    find_unused_parameters: bool = False
    num_threads: int | None = None
    check_every: int | None = None
    compile: bool = False
    precision: str = "fp32"

    def validate(self, world_size: int) -> None:
        check_range("trainer.meta_steps", self.meta_steps, 1, MAX_META_STEPS, "10^12")
        check_min("trainer.meta_batch_size", self.meta_batch_size, 1)
        check_min("trainer.checkpoint_every", self.checkpoint_every, 1)
        check_min("trainer.keep_checkpoints", self.keep_checkpoints, 1)
        check_min("trainer.eval_every", self.eval_every, 0)
        check_min("trainer.eval_batches", self.eval_batches, 1)
        if self.num_threads is not None:
            # A fixed bound, not this machine's cores: a config is often checked on
            # another machine (a login node) than the one it trains on.
            check_range("trainer.num_threads", self.num_threads, 1, 1024)
        if self.check_every is not None:
            check_min("trainer.check_every", self.check_every, 1)
        if not isinstance(self.compile, bool):
            raise ValueError(f"trainer.compile must be true or false, got {self.compile!r}")
        if not isinstance(self.fit_meta_batch, bool):
            raise ValueError(
                f"trainer.fit_meta_batch must be true or false, got {self.fit_meta_batch!r}"
            )
        check_choice("trainer.precision", self.precision, _PRECISIONS)
        if not _GPU_INDEX.fullmatch(str(self.device)):
            check_choice("trainer.device", self.device, (*_DEVICES, "cuda:N"))
        check_choice("trainer.backend", self.backend, _BACKENDS)
        if self.seed < 0:
            raise ValueError(f"trainer.seed must be >= 0, got {self.seed}")
        # the task streams take seed * 2**32 in 64 bits (tasks/nway_kshot.py)
        check_range("trainer.seed", self.seed, 0, 2**32 - 1, "a 32-bit seed")
        if self.backend == "nccl" and _GPU_INDEX.fullmatch(str(self.device)) and world_size > 1:
            raise ValueError(
                f"trainer.device={self.device} puts every rank on one GPU, which NCCL cannot "
                "share between ranks; use trainer.backend=gloo or trainer.device=auto"
            )
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("trainer.backend=nccl needs GPUs: set trainer.device=cuda or auto")
        if self.meta_batch_size % world_size:
            raise ValueError(
                f"trainer.meta_batch_size={self.meta_batch_size} is not divisible by the world "
                f"size {world_size}; the global meta-batch is split evenly over ranks, so choose "
                f"a multiple of {world_size}"
            )


@dataclass
class TrainConfig:
    """Everything a meta-training run needs.

    Attributes:
        experiment: the experiment's name (the `experiment=` choice).
        run_dir: the run directory shared by all ranks; `None` means `runs/<experiment>`
            relative to the working directory (composing a config from the command line
            adds `.<group>-<choice>` for the groups it picks: `train.compose.default_run_dir`).
        imports: modules to import before the components are built, e.g.
            `["my_samplers"]` for a module that registers a sampler, learner or model;
            importable from the working directory or `PYTHONPATH`.
        data: where tasks come from and how they are split and loaded (`DataConfig`).
        sampler: the task sampler and its options (`ComponentConfig`).
        model: the model and its options (`ModelConfig`).
        learner: the learner and its options (`ComponentConfig`).
        optimizer: the meta-optimizer (`OptimizerConfig`).
        trainer: the meta-training schedule (`TrainerConfig`).
        logging: what rank 0 reports (`LoggingConfig`).
        pretrain: classifier pre-training of the model before meta-training (off
            unless `pretrain.steps > 0`).
        selection: which checkpoint is the run's best on meta-val, and when it stops
            early (`metadist.train.selection`; with `trainer.eval_every > 0`).
        eval: the evaluation settings group, kept with the run's config so that the
            evaluation that ends training, and any re-scoring later, uses the run's own
            settings. Training does not read it: the evaluation layer types and checks it
            (`metadist.eval.EvalOptions`) before training starts.
    """

    experiment: str = "default"
    run_dir: str | None = None
    imports: list[str] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    sampler: ComponentConfig = field(default_factory=lambda: ComponentConfig("sinusoid"))
    model: ModelConfig = field(default_factory=lambda: ModelConfig("mlp"))
    learner: ComponentConfig = field(default_factory=lambda: ComponentConfig("maml"))
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    eval: dict[str, Any] = field(default_factory=dict)

    @property
    def evaluates_meta_val(self) -> bool:
        """Whether training evaluates meta-val (and so selects and stops early):
        `trainer.eval_every > 0` and meta-val has a share in `data.fractions`."""
        return self.trainer.eval_every > 0 and self.data.fractions[1] > 0

    @property
    def resolved_run_dir(self) -> Path:
        """The run directory: `run_dir`, or `runs/<experiment>` (never time-stamped)."""
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.experiment

    def validate(self, world_size: int = 1) -> None:
        """Checks every section.

        Raises:
            ValueError: the first bad field, named.
        """
        if not self.experiment or "/" in self.experiment:
            raise ValueError(f"experiment must be a plain name, got {self.experiment!r}")
        for section in ("sampler", "model", "learner"):
            if not getattr(self, section).name:
                raise ValueError(f"{section}.name must name a registered {section}")
        self.data.validate()
        self.model.validate()
        self.optimizer.validate()
        self.trainer.validate(world_size)
        self.logging.validate()
        self.pretrain.validate()
        self.selection.validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (JSON-safe), the inverse of `build_config`."""
        return to_plain(self)


def build_config(
    values: dict[str, Any],
    *,
    world_size: int | None = None,
    allow_imports: Collection[str] | None = None,
) -> TrainConfig:
    """A validated `TrainConfig` from a nested dict (a composed Hydra config).

    Args:
        values: nested sections as plain dicts/lists/scalars.
        world_size: ranks the run will use; `None` reads `WORLD_SIZE` (torchrun), else 1.
        allow_imports: `None` for a config of one's own (its `imports` are imported);
            for a config read from a run someone else may have made, the modules its
            `imports` may import (`import_modules`).

    Raises:
        ValueError: an unknown field, a value of the wrong type, or a bad value or
            combination, naming the field.
        FileNotFoundError: `data.store` names no directory.
    """
    check_finite_numbers(values)
    config = from_mapping(TrainConfig, values)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    import_modules(config.imports, allowed=allow_imports)  # first: they may register names
    config.validate(world_size)
    return config


def check_finite_numbers(values: Any, path: str = "") -> None:
    """Raises `ValueError` naming the first number in `values` (nested mappings and lists,
    component options included) that is NaN or infinite (`inner_lr=nan`,
    `optimizer.lr=1e400`, which YAML reads as inf)."""
    if isinstance(values, dict):
        for key, value in values.items():
            check_finite_numbers(value, f"{path}.{key}" if path else str(key))
    elif isinstance(values, (list, tuple)):
        for i, value in enumerate(values):
            check_finite_numbers(value, f"{path}[{i}]")
    elif isinstance(values, float) and not math.isfinite(values):
        raise ValueError(f"{path} must be a finite number, got {values!r}")


def without_nulls(value: Any) -> Any:
    """`value` with the null entries of its mappings dropped, at every depth: an option set
    to null and one left out both mean the component's default."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value
