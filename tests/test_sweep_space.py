"""Search-space files, override formatting, sweep settings and metric reading (no training)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest

from metadist.launch.sweep import (
    ParamSpec,
    SweepSettings,
    format_override,
    load_search_space,
    plan_trial,
    read_val_metric,
)


def _space(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_search_space_file_is_parsed(tmp_path):
    space = load_search_space(
        _space(
            tmp_path,
            "learner.options.inner_lr: {type: float, low: 1e-3, high: 1e-1, log: true}\n"
            "trainer.meta_batch_size: {type: int, low: 8, high: 32, step: 8}\n"
            "learner: {type: categorical, choices: [maml, fomaml]}\n"
            "model.options.hidden_sizes: {type: categorical, choices: [[40, 40], [80]]}\n",
        )
    )
    assert space == [
        ParamSpec("learner.options.inner_lr", "float", 1e-3, 1e-1, True, None),
        ParamSpec("trainer.meta_batch_size", "int", 8, 32, False, 8),
        ParamSpec("learner", "categorical", choices=("maml", "fomaml")),
        ParamSpec("model.options.hidden_sizes", "categorical", choices=([40, 40], [80])),
    ]


def test_suggestions_stay_in_the_space_and_lists_come_back_as_lists(tmp_path):
    space = load_search_space(
        _space(
            tmp_path,
            "lr: {type: float, low: 1e-3, high: 1e-1, log: true}\n"
            "size: {type: int, low: 8, high: 32, step: 8}\n"
            "hidden: {type: categorical, choices: [[40, 40], [80]]}\n",
        )
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        lr, size, hidden = (spec.suggest(trial) for spec in space)
        assert 1e-3 <= lr <= 1e-1
        assert size in (8, 16, 24, 32)
        assert hidden in ([40, 40], [80])
        assert space[2].decode(trial.params["hidden"]) == hidden
        study.tell(trial, lr)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "must map config keys to distributions"),
        ("x: {type: normal, low: 0, high: 1}\n", "x: type must be one of float, int, categorical"),
        ("x: {type: float, high: 1}\n", "x: low is required for type float"),
        ("x: {type: float, low: 2, high: 1}\n", "x: low=2.0 is above high=1.0"),
        ("x: {type: float, low: 0, high: 1, log: true}\n", "x: a log scale needs low > 0"),
        ("x: {type: int, low: 0.5, high: 3}\n", "x: low must be an integer, got 0.5"),
        ("x: {type: float, low: a, high: 1}\n", "x: low must be a number, got 'a'"),
        ("x: {type: float, low: 0, high: 1, size: 3}\n", "x: unknown field(s) ['size']"),
        ("x: {type: categorical, choices: []}\n", "x: choices must be a non-empty list"),
        ("x: {type: categorical, choices: [{a: 1}]}\n", "x: choice {'a': 1} is not a string"),
        ("trainer.seed: {type: int, low: 0, high: 9}\n", "trainer.seed: set by the sweep itself"),
        ("x: 3\n", "x: expected a mapping with 'type', got 3"),
        ("x y: {type: int, low: 0, high: 9}\n", "x y: not a config key"),
    ],
)
def test_bad_search_spaces_name_the_parameter(tmp_path, text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_search_space(_space(tmp_path, text))


def test_missing_search_space_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="space.yaml does not exist"):
        load_search_space(tmp_path / "space.yaml")
    with pytest.raises(ValueError, match="is a directory; name the YAML file"):
        load_search_space(tmp_path)
    (tmp_path / "bad.yaml").write_text("a: [1, 2\nb: 3\n")
    with pytest.raises(ValueError) as caught:
        load_search_space(tmp_path / "bad.yaml")
    assert "is not valid YAML at line" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.001, "k=0.001"),
        (16, "k=16"),
        (True, "k=true"),
        (None, "k=null"),
        ("fomaml", "k=fomaml"),
        ("two words", "k='two words'"),
        ("it's", "k='it\\'s'"),
        ([40, 40], "k=[40,40]"),
        ([0.1, "a b"], "k=[0.1,'a b']"),
    ],
)
def test_override_values_use_hydra_syntax(value, expected):
    assert format_override("k", value) == expected


def test_overrides_hydra_parses_back():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for value in (0.001, 16, True, "two words", "it's", [40, 40], [0.1, "a b"]):
        (parsed,) = parser.parse_overrides([format_override("k", value)])
        assert parsed.value() == value


def _settings(tmp_path, overrides, space=()):
    return SweepSettings(
        overrides=list(overrides), space=list(space), sweep_dir=tmp_path, num_trials=2
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.meta_steps=5"], "experiment=NAME is required"),
        (["experiment=x", "run_dir=/r"], "run_dir is set by the sweep for every trial"),
        (["experiment=x", "trainer.seed=3"], "trainer.seed is set by the sweep"),
        (["experiment=x", "optimizer.lr=0.1"], "optimizer.lr is both searched (--space) and fixed"),
    ],
)
def test_sweep_settings_refuse_conflicting_overrides(tmp_path, overrides, message):
    space = [ParamSpec("optimizer.lr", "float", 1e-4, 1e-2, True)]
    with pytest.raises(ValueError, match=re.escape(message)):
        _settings(tmp_path, overrides, space).validate()


def test_misspelt_slurm_launch_settings_are_refused(tmp_path):
    settings = _settings(tmp_path, ["experiment=x"])
    settings.launcher = "slurm"
    settings.slurm_settings = ["nodes=1", "node=2"]
    with pytest.raises(ValueError, match=re.escape("--slurm node=2 is not a Slurm launch setting")):
        settings.validate()


def test_a_misspelt_metric_is_refused_before_any_trial(tmp_path):
    from metadist.launch.sweep.settings import check_space

    settings = _settings(tmp_path, ["experiment=sinusoid_maml", "trainer.eval_every=10"])
    settings.metric = "query_los_after"
    with pytest.raises(ValueError, match=re.escape("--metric query_los_after: no built-in")):
        check_space(settings)  # with no search space too
    settings.metric = "query_loss_after"  # the learners' own name, or one of a user's learner
    check_space(settings)
    settings.metric = "my_learners_score"
    check_space(settings)
    settings.metric = "query_accuracy_after"  # logged by cross-entropy learners alone
    with pytest.raises(ValueError, match="learner maml with loss mse logs no accuracy"):
        check_space(settings)


@pytest.mark.parametrize(
    ("overrides", "slurm", "message"),
    [
        (
            ["experiment=sinusoid_maml", "trainer.eval_every=10"],
            ["nodes=2", "gpus_per_node=4"],
            "trainer.meta_batch_size=25 is not divisible by the world size 8",
        ),
        (
            ["experiment=sinusoid", "trainer.eval_every=10"],
            [],
            "experiment=sinusoid: no such experiment",
        ),
        (
            ["experiment=sinusoid_maml", "trainer.eval_every=10", "node=2"],
            [],
            "node: unknown field",
        ),
    ],
)
def test_trial_configs_are_checked_before_launch(tmp_path, overrides, slurm, message):
    settings = _settings(tmp_path, overrides)
    settings.launcher = "slurm"
    settings.slurm_settings = slurm
    run_dir = tmp_path / "trials" / "0000"
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_trial(settings, 0, 0, {}, run_dir)
    assert not run_dir.exists()


def test_component_options_are_checked_before_the_sweep_and_base_overrides_blamed(tmp_path):
    """A misspelt learner option in the space, or in the base overrides, is refused before
    anything is written (trials ran and failed, leaving a study the corrected command
    refused); the base overrides' mistake is not blamed on the space."""
    from metadist.launch.sweep.settings import check_space

    base = ["experiment=sinusoid_maml", "trainer.eval_every=10"]
    space = [ParamSpec("learner.options.inner_lrr", "float", 1e-3, 1e-1, True)]
    with pytest.raises(ValueError, match=r"search space: learner.options.inner_lrr=0.001 gives "
                       r"an invalid trial config: learner.options.inner_lrr: unknown option"):  # fmt: skip
        check_space(_settings(tmp_path, base, space))
    space = [ParamSpec("optimizer.lr", "float", 1e-4, 1e-2, True)]
    with pytest.raises(ValueError, match=r"the sweep's overrides give an invalid config: "
                       r"learner.options.inner_lrr: unknown option"):  # fmt: skip
        check_space(_settings(tmp_path, [*base, "learner.options.inner_lrr=0.1"], space))
    # a sweep without meta-val evaluation: the overrides' mistake, not the space's
    with pytest.raises(ValueError, match=r"the sweep's overrides give an invalid config: "
                       r"trainer.eval_every must be > 0 in a sweep"):  # fmt: skip
        check_space(_settings(tmp_path, [*base, "trainer.eval_every=0"], space))
    assert list(tmp_path.iterdir()) == []
    # a base that is invalid alone but fixed by every trial's parameters is a valid sweep
    space = [ParamSpec("trainer.meta_batch_size", "categorical", choices=(16, 32))]
    valid = _settings(tmp_path, base, space)
    valid.nproc_per_node = 2  # the experiment's meta-batch of 25 does not divide over 2
    check_space(valid)


def test_eval_settings_in_a_sweep_are_refused_up_front(tmp_path):
    """Trials train with --no-eval, which refuses eval.* overrides: the sweep says so
    before anything runs (every trial failed)."""
    settings = _settings(tmp_path, ["experiment=sinusoid_maml", "eval.inner_steps=3"])
    with pytest.raises(ValueError, match=r"eval.inner_steps=3: a sweep's trials never "):
        settings.validate()


def test_a_launch_setting_among_the_overrides_is_pointed_at_slurm(tmp_path):
    """`--slurm nodes=2 gpus_per_node=4` reads gpus_per_node=4 as an override: the
    message says it is a launch setting (it said "unknown field")."""
    settings = _settings(tmp_path, ["experiment=sinusoid_maml", "gpus_per_node=4"])
    with pytest.raises(ValueError, match=r"gpus_per_node=4 is a Slurm launch setting.*"
                       r"--slurm gpus_per_node=4"):  # fmt: skip
        settings.validate()


def test_best_yaml_takes_the_trials_own_overrides(tmp_path):
    """best.yaml's overrides are those the trial trained with (command.json), less its
    run directory, progress setting and command-line flags (--config-dir is its own
    field): the pinned meta-test split is among them."""
    from metadist.launch.sweep.reports import _trial_overrides

    argv = ["python", "-m", "metadist.train", "--no-eval", "experiment=x", "optimizer.lr=0.1",
            "trainer.seed=3", "data.pinned_test_units=[4,7]", "logging.progress=false",
            f"run_dir={tmp_path}", "--config-dir", "mine"]  # fmt: skip
    (tmp_path / "command.json").write_text(json.dumps({"argv": argv}))
    assert _trial_overrides(str(tmp_path)) == [
        "experiment=x", "optimizer.lr=0.1", "trainer.seed=3", "data.pinned_test_units=[4,7]"
    ]  # fmt: skip
    assert _trial_overrides(str(tmp_path / "missing")) is None
    # a progress setting of the user's own stays; the sweep's (the last) goes
    argv[4:4] = ["logging.progress=true"]
    (tmp_path / "command.json").write_text(json.dumps({"argv": argv}))
    assert _trial_overrides(str(tmp_path))[:2] == ["logging.progress=true", "experiment=x"]
    assert len(_trial_overrides(str(tmp_path))) == 5


def test_val_metric_is_read_as_the_run_writes_it(tmp_path):
    records = [
        {"step": 10, "split": "train", "loss": 3.0},
        {"step": 10, "split": "val", "loss": 2.5, "mse": 2.0},
        {"step": 20, "split": "val", "loss": "nan"},
    ]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 30, "split": "va')
    points = read_val_metric(tmp_path, "loss")
    assert points[0] == (10, 2.5)
    assert points[1][0] == 20 and points[1][1] != points[1][1]  # NaN
    assert len(points) == 2  # the half-written line is not read
    assert read_val_metric(tmp_path / "missing", "loss") == []
    with pytest.raises(ValueError, match=re.escape("--metric 'mae' is not in the val records")):
        read_val_metric(tmp_path, "mae")


def test_a_point_at_the_trainings_last_step_is_never_pruned():
    """A trial that has trained all its steps completes, even where the pruner would
    prune it at that step (it was recorded as pruned while writing its checkpoint)."""
    from metadist.launch.sweep.driver import _Driver

    class Pruning:  # a trial whose pruner always says prune
        def __init__(self):
            self.reported = []

        def report(self, value, step):
            self.reported.append((step, value))

        def should_prune(self):
            return True

    driver = _Driver.__new__(_Driver)
    driver.reported = {}
    trial = Pruning()
    assert driver.report(0, trial, [(10, 0.5)], running=True, last=10) is None
    assert trial.reported == [(10, 0.5)]  # reported all the same
    driver.reported = {}
    assert driver.report(0, Pruning(), [(5, 0.7)], running=True, last=10) == (5, 0.7)


def test_a_rerun_refuses_settings_of_its_own(capsys):
    """`--rerun N` runs the trial as its study recorded it: other overrides or a space
    are refused in one line (they were silently ignored)."""
    from metadist.cli import main

    code = main(["sweep", "--sweep-dir=x", "--rerun=0", "experiment=sinusoid_maml"])
    assert code == 1
    assert "leave out experiment=sinusoid_maml" in capsys.readouterr().err
    assert main(["sweep", "--rerun=0"]) == 1
    assert "--rerun needs --sweep-dir" in capsys.readouterr().err
    for flag in ("--metric=query_loss_before", "--slurm=nodes=1", "--parallel=2"):
        assert main(["sweep", "--sweep-dir=x", "--rerun=0", flag]) == 1
        assert f"leave out {flag.split('=')[0]}" in capsys.readouterr().err


def test_an_unhashable_key_in_the_space_is_one_line(tmp_path):
    (tmp_path / "space.yaml").write_text("? [a, b]\n: {type: float, low: 0, high: 1}\n")
    with pytest.raises(ValueError, match="is not valid YAML at line 1"):
        load_search_space(tmp_path / "space.yaml")
