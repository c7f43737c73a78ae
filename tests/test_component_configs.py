"""One shape for every component: typed options, one registry, the `metadist` commands.

A misspelt option of any component is one line naming its field path and the closest
valid name, before any run directory exists; a component named in place of its config
group's own does not inherit that group's options; the learner decides once whether a
model runs batched and raises real errors after that.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from metadist.batch import MetaBatch, TaskSet
from metadist.cli import main as cli_main
from metadist.learners import build_learner
from metadist.models import get_model
from metadist.registry import Registry
from metadist.tasks import (
    SinusoidSampler,
    TaskSampler,
    build_task_sampler,
    register_task_sampler,
    task_uniform,
)
from metadist.train.compose import compose_dict, load_config

ROOT = Path(__file__).resolve().parents[1]

MISSPELT = [
    # (component, override, the field path named, the closest valid name)
    ("sampler", "sampler.options.num_suport=3", "sampler.options.num_suport", "num_support"),
    ("model", "model.options.hiden_sizes=[8]", "model.options.hiden_sizes", "hidden_sizes"),
    ("learner", "learner.options.inner_lrr=0.1", "learner.options.inner_lrr", "inner_lr"),
    ("optimizer", "optimizer.lrr=0.1", "optimizer.lrr", "'lr'"),
    ("eval", "eval.max_task=8", "eval.max_task", "max_tasks"),
    ("trainer", "trainer.metasteps=5", "trainer.metasteps", "meta_steps"),
]


@pytest.mark.parametrize("component,override,path,closest", MISSPELT, ids=[m[0] for m in MISSPELT])
def test_a_misspelt_option_is_one_line_naming_its_path(
    component, override, path, closest, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    code = cli_main(["train", "experiment=sinusoid_maml", f"run_dir={run_dir}", override])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"metadist train: error: {path}: unknown"), err
    assert f"did you mean {closest}" in err or f"did you mean '{closest}'" in err, err
    assert not run_dir.exists()


def test_a_misspelt_sweep_flag_names_the_closest(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    code = cli_main(
        ["sweep", "experiment=sinusoid_maml", "--sweep-dir", str(sweep_dir), "--trails", "3"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "metadist sweep: error: unrecognized argument --trails; did you mean --trials? "
        "(see metadist sweep --help)"
    ]
    assert not sweep_dir.exists()


def test_sweep_defaults_live_in_the_settings(tmp_path):
    """The flags the user leaves out take SweepSettings' own defaults."""
    import argparse
    import dataclasses

    from metadist.commands import sweep as sweep_cli
    from metadist.launch.sweep.settings import SweepSettings

    (tmp_path / "space.yaml").write_text("optimizer.lr: {type: float, low: 0.001, high: 0.1}\n")
    subparsers = argparse.ArgumentParser().add_subparsers()
    sweep_cli.register_cli(subparsers)
    parser = subparsers.choices["sweep"]
    args = parser.parse_args(
        ["experiment=sinusoid_maml", "--space", str(tmp_path / "space.yaml"), "--parallel", "2"]
    )
    settings = sweep_cli._settings_from_args(args)
    defaults = {f.name: f.default for f in dataclasses.fields(SweepSettings)}
    assert settings.parallel == 2
    for name in ("num_trials", "metric", "direction", "pruner", "poll_seconds", "max_failures"):
        assert getattr(settings, name) == defaults[name], name


@register_task_sampler("width_lines_for_config_test")
class WidthLines(TaskSampler):
    """A user sampler with options of its own (none of them the default sampler's)."""

    needs_store = False

    def __init__(self, *, width: int = 3, num_tasks: int = 12) -> None:
        self.width, self.num_tasks = width, num_tasks

    @property
    def num_units(self) -> int:
        return self.num_tasks

    def sample(self, units, seeds):
        draws = torch.from_numpy(task_uniform(seeds, 2 * self.width)).float()[..., None]
        n, k = len(units), self.width
        return MetaBatch(
            support=TaskSet(draws[:, :k].contiguous(), 2 * draws[:, :k]),
            query=TaskSet(draws[:, k:].contiguous(), 2 * draws[:, k:]),
            entity_index=torch.as_tensor(units, dtype=torch.int64),
            stratum=torch.zeros(n, dtype=torch.int64),
            split_time=torch.full((n,), -1, dtype=torch.int64),
        )


def _experiments_with(tmp_path: Path, name: str, body: str) -> Path:
    """A copy of the shipped experiments with one more experiment file."""
    import shutil

    directory = tmp_path / "experiments"
    shutil.copytree(ROOT / "experiments", directory)
    (directory / "experiment" / f"{name}.yaml").write_text(body)
    return directory


def test_a_user_sampler_in_an_experiment_file_does_not_inherit_the_group_options(tmp_path):
    directory = _experiments_with(
        tmp_path,
        "user_width",
        "# @package _global_\nsampler:\n  name: width_lines_for_config_test\n",
    )
    values = compose_dict(["experiment=user_width"], directory)
    # the default group (sinusoid) has options; none of them reach the user's sampler
    assert values["sampler"] == {"name": "width_lines_for_config_test"}
    config = load_config(["experiment=user_width", "sampler.options.width=4"], directory)
    assert config.sampler.options == {"width": 4}
    from metadist.train.build import build_task_source

    source = build_task_source(config)
    assert source.sampler.width == 4 and source.input_shape == (1,)
    # and its own options are checked like the built-ins'
    config = load_config(["experiment=user_width", "sampler.options.widht=4"], directory)
    with pytest.raises(ValueError, match=r"sampler.options.widht: .*did you mean 'width'"):
        build_task_source(config)
    # options that leave it no units are named as its own, not as data.fractions'
    config = load_config(["experiment=user_width", "sampler.options.num_tasks=0"], directory)
    with pytest.raises(ValueError, match=r"sampler 'width_lines_for_config_test' has no units "
                       r"\(tasks\) to draw from with sampler.options \{'num_tasks': 0\}"):  # fmt: skip
        build_task_source(config)


def test_selecting_another_group_option_keeps_that_groups_options():
    values = compose_dict(["experiment=sinusoid_maml", "learner=fomaml"])
    assert values["learner"]["name"] == "maml"
    assert values["learner"]["options"]["first_order"] is True


def test_the_registry_checks_options_before_building():
    registry: Registry = Registry("widget", positional=1)
    built = []

    @registry.register("plain")
    class Plain:
        def __init__(self, size: int, *, depth: int = 2, names: tuple[str, ...] = ()) -> None:
            built.append((size, depth, names))

    registry.build("plain", 5, options={"depth": 3, "names": ["a"]})
    assert built == [(5, 3, ("a",))]
    with pytest.raises(ValueError, match=r"^widget.options.dept: .*did you mean 'depth'"):
        registry.build("plain", 5, options={"dept": 3})
    with pytest.raises(ValueError, match=r"widget.options.depth must be an integer, got 'x'"):
        registry.build("plain", 5, options={"depth": "x"})
    with pytest.raises(ValueError, match=r"unknown widget 'plian'.*did you mean 'plain'"):
        registry.get("plian")
    assert len(built) == 1  # nothing was constructed from bad options


def test_learner_subclasses_declare_only_what_they_add():
    import dataclasses

    from metadist.learners import InnerLoopLearner, get_learner

    def fields(cls):
        return {f.name for f in dataclasses.fields(cls)}

    base = fields(InnerLoopLearner.Options)
    maml = fields(get_learner("maml").Options)
    anil = fields(get_learner("anil").Options)
    assert maml - base == {
        "learn_inner_lr",
        "inner_lr_per_layer",
        "multi_step_loss_steps",
        "first_order_steps",
        "prototype_head",
        "prototype_scale",
        "inner_optimizer",
        "eval_inner_optimizer",
        "eval_inner_lr",
        "eval_inner_lr_by_shots",
        "eval_inner_steps_by_shots",
    }
    assert anil - maml == {"head"}
    model = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    learner = build_learner("anil", model, head=None, inner_lr=0.1, learn_inner_lr=True)
    assert learner.inner_lr == 0.1 and learner.learn_inner_lr and learner.head
    with pytest.raises(ValueError, match="learner.options.first_order: Reptile is first order"):
        build_learner("reptile", model, first_order=False)


# ---------------------------------------------------------------- typed options flow


def test_typed_options_flow_from_the_config_to_the_component():
    """The config's options are read once into the component's `Options`; that object is
    what the component receives and keeps, and the saved config stays plain."""
    import dataclasses

    from metadist.models import MODELS, build_model
    from metadist.train.build import build_task_source

    config = load_config(["experiment=sinusoid_maml", "sampler.options.num_support=3"])
    assert config.sampler.typed_options is None  # not read before the build
    source = build_task_source(config)
    typed = config.sampler.typed_options
    assert source.sampler.options is typed
    assert isinstance(typed, SinusoidSampler.Options) and typed.num_support == 3
    options = config.model.read_options(MODELS)
    model = build_model(config.model.name, (1,), (1,), options=options)
    assert model.options is options is config.model.typed_options
    saved = config.to_dict()
    assert (
        "typed_options" not in saved["sampler"] and saved["sampler"]["options"]["num_support"] == 3
    )
    assert dataclasses.replace(config).sampler.options == config.sampler.options


def test_constructors_keep_their_keyword_interface():
    by_keywords = SinusoidSampler(num_support=3, query_grid=True)
    assert by_keywords.options == SinusoidSampler.Options(num_support=3, query_grid=True)
    by_object = SinusoidSampler(options=SinusoidSampler.Options(num_support=3))
    assert by_object.num_support == 3 and by_object.options.num_tasks == 10_000
    with pytest.raises(TypeError, match="not both"):
        SinusoidSampler(options=SinusoidSampler.Options(), num_support=3)
    with pytest.raises(ValueError, match="sinusoid sampler: num_query must be >= 1"):
        SinusoidSampler(options=SinusoidSampler.Options(num_query=0))  # validated too
    with pytest.raises(
        ValueError,
        match=r"^sampler.options.num_suport: unknown option of task sampler 'sinusoid'; "
        "did you mean 'num_support'",
    ):
        SinusoidSampler(num_suport=3)
    with pytest.raises(ValueError, match=r"^model.options.hiden_sizes: .*'hidden_sizes'"):
        get_model("mlp")((1,), (1,), hiden_sizes=(8,))


@register_task_sampler("noisy_sinusoid_for_config_test")
class NoisySinusoid(SinusoidSampler):
    """A subclass that declares only the option it adds."""

    @dataclasses.dataclass(frozen=True)
    class Options(SinusoidSampler.Options):
        noise: float = 0.0


@register_task_sampler("keyword_sinusoid_for_config_test")
class KeywordSinusoid(SinusoidSampler):
    """A subclass in the plain-keyword style: its constructor's keywords are its options."""

    def __init__(self, *, extra: int = 1) -> None:
        super().__init__(num_tasks=20)
        self.extra = extra


def test_a_subclass_declares_only_the_options_it_adds():
    def fields(cls):
        return {f.name for f in dataclasses.fields(cls)}

    assert fields(NoisySinusoid.Options) - fields(SinusoidSampler.Options) == {"noise"}
    sampler = build_task_sampler("noisy_sinusoid_for_config_test", noise=0.5, num_support=4)
    assert isinstance(sampler.options, NoisySinusoid.Options)
    assert (sampler.options.noise, sampler.num_support) == (0.5, 4)
    with pytest.raises(ValueError, match=r"sampler.options.noize: .*did you mean 'noise'"):
        build_task_sampler("noisy_sinusoid_for_config_test", noize=0.5)
    # the window forecaster extends the MLP's options (and widens its default)
    forecaster, mlp = get_model("forecaster"), get_model("mlp")
    assert fields(forecaster.Options) - fields(mlp.Options) == {
        "window_norm",
        "target_channels",
        "seasonal_period",
        "seasonality",
        "clamp",
        "head_init",
    }
    assert forecaster.Options().hidden_sizes == (64, 64) != mlp.Options().hidden_sizes


def test_a_keyword_subclass_of_a_typed_sampler_keeps_working():
    """The signature-derived schema stays the fallback: a subclass whose constructor
    declares keywords is built with them, even under a typed parent."""
    sampler = build_task_sampler("keyword_sinusoid_for_config_test", extra=2)
    assert sampler.extra == 2 and sampler.num_tasks == 20
    assert isinstance(sampler.options, SinusoidSampler.Options)  # its parent's, typed
    with pytest.raises(ValueError, match=r"sampler.options.num_tasks: unknown option"):
        build_task_sampler("keyword_sinusoid_for_config_test", num_tasks=3)


def test_with_options_rebuilds_a_typed_sampler_with_checked_values():
    sampler = SinusoidSampler(num_support=3)
    rebuilt = sampler.with_options(num_query=4)
    assert rebuilt.options == SinusoidSampler.Options(num_support=3, num_query=4)
    with pytest.raises(ValueError, match=r"eval.sampler_options.num_query must be an integer"):
        sampler.with_options(num_query="4")
    with pytest.raises(ValueError, match="has no option 'num_qeury'"):
        sampler.with_options(num_qeury=4)


# ---------------------------------------------------------------- explicit batching


def _batch(num_tasks=3, k=4):
    g = torch.Generator().manual_seed(0)

    def side():
        return TaskSet(torch.randn(num_tasks, k, 1, generator=g), torch.randn(num_tasks, k, 1))

    return MetaBatch(
        support=side(),
        query=side(),
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


class BuggyBatched(nn.Module):
    """Its own batched path has a real bug; its per-task path is fine."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(1, 1)

    def forward(self, x):
        return self.head(x)

    def batched_forward(self, params, x):
        raise IndexError("a real bug in batched_forward")


class FailsUnderVmapWithABug(nn.Module):
    """Under vmap it raises an ordinary error (not a vmap limitation): a shape bug."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(1, 1)

    def forward(self, x):
        if torch._C._functorch.is_batchedtensor(x):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 2x1)")
        return self.head(x)


class VmapLimitedLater(nn.Module):
    """Batches fine at first; later hits a vmap limitation (e.g. a data-dependent op)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(1, 1)
        self.calls = 0

    def forward(self, x):
        if torch._C._functorch.is_batchedtensor(x) and self.broken:
            raise RuntimeError("vmap: It looks like you're calling .item() on a Tensor")
        return self.head(x)

    broken = False


@pytest.mark.parametrize("model_cls", [BuggyBatched, FailsUnderVmapWithABug])
def test_a_genuine_error_of_the_batched_path_raises(model_cls):
    learner = build_learner("maml", model_cls(), first_order=True)
    with pytest.raises((IndexError, RuntimeError), match="real bug|shapes cannot be multiplied"):
        learner(_batch())
    assert not learner._vmap_failed


def test_after_the_batching_decision_errors_raise(caplog):
    import logging

    model = VmapLimitedLater()
    learner = build_learner("maml", model, first_order=True)
    with caplog.at_level(logging.INFO, logger="metadist.learners"):
        learner(_batch())
    assert any("runs its tasks batched (vmap)" in r.getMessage() for r in caplog.records)
    VmapLimitedLater.broken = True
    try:
        with pytest.raises(RuntimeError, match="vmap"):
            learner(_batch())
    finally:
        VmapLimitedLater.broken = False
    assert not learner._vmap_failed
    # a fresh learner meeting the limitation at its first call loops, once announced
    model = VmapLimitedLater()
    model.broken = True
    learner = build_learner("maml", model, first_order=True)
    learner(_batch())
    assert learner._vmap_failed


# --------------------------------------------------------------------- the commands


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


@pytest.mark.integration
def test_the_metadist_commands_run(tmp_path):
    from metadist import __version__

    version = _run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"metadist {__version__}"
    printed = _run("train", "experiment=sinusoid_maml", "eval.max_tasks=7", "--print-config")
    assert printed.returncode == 0, printed.stderr
    assert "\neval:\n" in printed.stdout and "max_tasks: 7" in printed.stdout
    demo = _run("demo", "--help")
    assert demo.returncode == 0 and "usage: metadist demo" in demo.stdout
    no_run = _run("eval")
    assert no_run.returncode == 2
    assert no_run.stderr.strip() == "metadist eval: error: give the run as run_dir=PATH"
    missing = _run("eval", f"run_dir={tmp_path / 'none'}")
    assert missing.returncode == 1 and missing.stderr.startswith("metadist eval: error:")
    assert "Traceback" not in missing.stderr


@pytest.mark.integration
def test_metadist_train_then_eval_on_the_recorded_settings(tmp_path):
    run_dir = tmp_path / "run"
    common = [
        "experiment=sinusoid_maml",
        f"run_dir={run_dir}",
        "trainer.meta_steps=4",
        "trainer.meta_batch_size=4",
        "trainer.checkpoint_every=4",
        "eval.max_tasks=6",
        "eval.scratch_steps=0",
    ]
    trained = _run("train", *common)
    assert trained.returncode == 0, trained.stderr
    import json

    evaluated = _run("eval", f"run_dir={run_dir}", "eval.batch_size=3")
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    # the run's own eval settings (max_tasks=6) are used, the override on top of them
    assert metrics["num_tasks"] == 6, metrics.get("num_tasks")
    assert np.isfinite(metrics["overall"]["adapted"]["mse"]["value"])


@pytest.mark.integration
@pytest.mark.slow  # 12-21 s: `make test` stays under 10 minutes (`make test-slow` runs it)
def test_nproc_per_node_checks_the_config_once_then_runs_torchrun(tmp_path):
    bad = _run(
        "train",
        "--nproc-per-node=2",
        "experiment=sinusoid_maml",
        "trainer.meta_batch_size=25",
        f"run_dir={tmp_path / 'bad'}",
    )
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "metadist train: error: trainer.meta_batch_size=25 is not divisible by the world size "
        "2; the global meta-batch is split evenly over ranks, so choose a multiple of 2"
    ]
    assert not (tmp_path / "bad").exists()
    run_dir = tmp_path / "run"
    good = _run(
        "train",
        "--nproc-per-node",
        "2",
        "experiment=sinusoid_maml",
        f"run_dir={run_dir}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=4",
        "trainer.checkpoint_every=2",
        "--no-eval",
    )
    assert good.returncode == 0, good.stderr
    from metadist.train import latest_checkpoint_state

    state = latest_checkpoint_state(run_dir)
    assert state["step"] == 2 and state["world_size"] == 2
