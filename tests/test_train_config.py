"""Bad configs stop before any process group forms, with an error naming the field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from metadist.train.compose import EXPERIMENTS_ENV, find_experiments_dir, load_config
from metadist.train.config import build_config
from metadist.train.distributed import read_env


def sinusoid(*overrides: str, world_size: int = 1):
    return load_config(["experiment=sinusoid_maml", *overrides], world_size=world_size)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("trainer.meta_steps=0", "trainer.meta_steps"),
        ("trainer.meta_batch_size=-2", "trainer.meta_batch_size"),
        ("trainer.checkpoint_every=0", "trainer.checkpoint_every"),
        ("trainer.device=tpu", "trainer.device"),
        ("trainer.backend=mpi", "trainer.backend"),
        ("trainer.seed=-1", "trainer.seed"),
        ("trainer.meta_steps=ten", "trainer.meta_steps"),
        ("trainer.meta_steps=1.5", "trainer.meta_steps"),
        ("optimizer.lr=0", "optimizer.lr"),
        ("optimizer.name=lbfgs", "optimizer.name"),
        ("optimizer.betas=[0.9]", "optimizer.betas"),
        ("optimizer.grad_clip=-1", "optimizer.grad_clip"),
        ("data.fractions=[0.5,0.6,0.1]", "data.fractions"),
        ("data.num_workers=-1", "data.num_workers"),
        ("data.prefetch_factor=2", "data.prefetch_factor"),
        ("data.order=sorted", "data.order"),
        ("data.window_blocks=0", "data.window_blocks"),
        ("data.window_blocks=1180591620717411303424", "data.window_blocks must be <= "),
        ("data.store=/no/such/store", "data.store"),
        ("logging.wandb.mode=sometimes", "logging.wandb.mode"),
        ("logging.wandb.project=team/metadist", "logging.wandb.project='team/metadist'"),
        (f"logging.wandb.project={'p' * 129}", "logging.wandb.project is 129 characters"),
        ("logging.log_every=0", "logging.log_every"),
        ("logging.progress=maybe", "logging.progress"),
        ("+trainer.meta_batch_sise=4", "trainer.meta_batch_sise"),
        ("trainer.meta_batch_sise=4", "trainer.meta_batch_sise"),
        ("learner=no_such_learner", "no_such_learner"),
        ("sampler.name=''", "sampler.name"),
    ],
)
def test_bad_value_names_the_field(override, field):
    with pytest.raises((ValueError, FileNotFoundError), match=field.replace(".", r"\.")):
        sinusoid(override)


def test_backend_and_device_combination_is_checked():
    with pytest.raises(ValueError, match=r"trainer\.backend=nccl"):
        sinusoid("trainer.backend=nccl", "trainer.device=cpu")
    if not _has_cuda():
        with pytest.raises(ValueError, match=r"trainer\.device=cuda"):
            read_env("cuda", "auto")


def test_global_meta_batch_must_divide_over_ranks():
    assert sinusoid("trainer.meta_batch_size=24", world_size=4).trainer.meta_batch_size == 24
    with pytest.raises(ValueError, match=r"trainer\.meta_batch_size=25 is not divisible by .* 2"):
        sinusoid("trainer.meta_batch_size=25", world_size=2)


def test_world_size_comes_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    values = sinusoid().to_dict()
    values["trainer"]["meta_batch_size"] = 10
    with pytest.raises(ValueError, match="divisible by the world size 3"):
        build_config(values)


def test_component_options_are_checked_before_training():
    from metadist.train.build import build_parts

    env = read_env("cpu")
    for override, field in [
        ("sampler.options.num_support=0", "sampler"),
        ("model.options.activation=swish", "model"),
        ("+learner.options.inner_lrr=0.1", "learner"),
        ("trainer.meta_batch_size=90000", "trainer.meta_batch_size"),
        ("data.order=blocked", "data.order=blocked.*does not say which store rows"),
    ]:
        with pytest.raises(ValueError, match=field):
            build_parts(sinusoid(override), env)


def test_a_meta_batch_larger_than_a_split_says_what_to_change(capsys):
    from metadist.train.build import build_parts

    env = read_env("cpu")
    # 40 tasks, 10% meta-val: 4 meta-val tasks, fewer than a meta-batch of 16. Meta-val
    # is still monitored, in batches of the 4 it has, with a note.
    small = ["sampler.options.num_tasks=40", "trainer.meta_batch_size=16"]
    parts = build_parts(sinusoid(*small, "trainer.eval_every=5"), env)
    assert "meta-val has 4 task(s) per rank" in capsys.readouterr().err
    assert next(iter(parts.val_loader)).num_tasks == 4
    assert next(iter(parts.train_loader)).num_tasks == 16
    # A meta-train split smaller than a meta-batch: refused, saying what to change.
    with pytest.raises(ValueError, match="to fix: lower trainer.meta_batch_size.*data.fractions"):
        build_parts(sinusoid("sampler.options.num_tasks=40", "trainer.meta_batch_size=64"), env)
    # ... unless the recipe fits the batch to the data (trainer.fit_meta_batch): meta-train
    # then trains in batches of its 32 tasks, and meta-val in batches of its 4.
    fitted = ["trainer.meta_batch_size=64", "trainer.fit_meta_batch=true", "trainer.eval_every=5"]
    parts = build_parts(sinusoid("sampler.options.num_tasks=40", *fitted), env)
    assert "meta-train has 32 task(s) per rank and epoch, fewer than the 64" in (
        capsys.readouterr().err
    )
    assert next(iter(parts.train_loader)).num_tasks == 32
    assert next(iter(parts.val_loader)).num_tasks == 4
    # a split that holds a whole meta-batch is not touched
    parts = build_parts(sinusoid("sampler.options.num_tasks=400", *fitted), env)
    assert next(iter(parts.train_loader)).num_tasks == 64
    assert "meta-train has" not in capsys.readouterr().err
    with pytest.raises(ValueError, match="trainer.fit_meta_batch must be true or false"):
        build_parts(sinusoid("trainer.fit_meta_batch=3"), env)


def test_unknown_section_and_type_errors_name_the_path():
    values = sinusoid().to_dict()
    with pytest.raises(ValueError, match="trainerr: unknown field"):
        build_config({**values, "trainerr": {}})
    with pytest.raises(ValueError, match=r"trainer must be a mapping"):
        build_config({**values, "trainer": 3})


def test_experiments_dir_lookup(tmp_path, monkeypatch):
    found = find_experiments_dir()
    assert (found / "config.yaml").is_file()
    with pytest.raises(FileNotFoundError, match="--config-dir"):
        find_experiments_dir(tmp_path)
    monkeypatch.setenv(EXPERIMENTS_ENV, str(found))
    monkeypatch.chdir(tmp_path)
    assert find_experiments_dir() == found


def test_cli_reports_bad_config_without_traceback(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "metadist.train",
            "experiment=sinusoid_maml",
            "optimizer.lr=-1",
            f"run_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "metadist-train: error: optimizer.lr must be > 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_only_local_rank_0_prints_a_config_error(tmp_path):
    import os

    command = [sys.executable, "-m", "metadist.train", "experiment=sinusoid_maml"]
    # As under torchrun --nproc_per_node=2: the odd meta-batch of 25 cannot be split.
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    other = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert other.returncode == 1 and "error" not in other.stderr
    env.update(RANK="0", LOCAL_RANK="0")
    first = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 1
    assert "trainer.meta_batch_size=25 is not divisible" in first.stderr


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_options_and_overrides_mix_in_any_order():
    from metadist.train.__main__ import build_parser

    args = build_parser().parse_intermixed_args(
        ["experiment=sinusoid_maml", "--no-eval", "trainer.meta_steps=10", "--config-dir", "x"]
    )
    assert args.overrides == ["experiment=sinusoid_maml", "trainer.meta_steps=10"]
    assert args.no_eval and args.config_dir == "x"


def test_eval_overrides_reach_the_evaluation_that_ends_training(tmp_path, capsys):
    from metadist.train.__main__ import main

    run_dir = tmp_path / "run"
    common = [
        "experiment=sinusoid_maml",
        f"run_dir={run_dir}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=4",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
    ]
    # A bad evaluation setting is refused before any training, naming the field.
    assert main([*common, "eval.max_task=8"]) == 1
    assert "eval.max_task: unknown field" in capsys.readouterr().err
    assert not run_dir.exists()
    assert main([*common, "--no-eval", "eval.max_tasks=8"]) == 1
    assert "--no-eval" in capsys.readouterr().err and not run_dir.exists()

    assert main([*common, "eval.max_tasks=8", "eval.scratch_steps=0"]) == 0
    result = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert result["num_tasks"] == 8 and result["settings"]["scratch_steps"] == 0


def test_ensemble_evaluation_of_two_runs(tmp_path):
    from metadist.eval import evaluate_run
    from metadist.train.__main__ import main

    common = [
        "experiment=sinusoid_maml",
        "trainer.meta_steps=3",
        "trainer.meta_batch_size=4",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "--no-eval",
    ]
    # b splits the tasks as a does (its seed): a member trained on a's meta-test tasks
    # is refused (tests/test_ensemble_held_out.py)
    for name, extra in (("a", []), ("b", ["learner.options.inner_lr=0.02"])):
        assert main([*common, f"run_dir={tmp_path / name}", "trainer.seed=1", *extra]) == 0
    assert main([*common, f"run_dir={tmp_path / 'c'}", "sampler.options.num_support=3"]) == 0
    overrides = ["eval.max_tasks=16", "eval.scratch_steps=0"]
    alone = evaluate_run(tmp_path / "a", overrides=overrides, write=False)
    other = evaluate_run(tmp_path / "b", overrides=overrides, write=False)
    both = evaluate_run(
        tmp_path / "a", overrides=[*overrides, f"eval.ensemble=[{tmp_path / 'b'}]"], write=False
    )
    assert (
        "mean of" in both["settings"]["ensemble"]
        and str(tmp_path / "b") in both["settings"]["ensemble"]
    )
    values = [r["overall"]["adapted"]["mse"]["value"] for r in (alone, other, both)]
    assert values[2] not in values[:2]
    with pytest.raises(ValueError, match="sampler.options"):
        evaluate_run(tmp_path / "a", overrides=[*overrides, f"eval.ensemble=[{tmp_path / 'c'}]"])
    with pytest.raises(FileNotFoundError, match="no run directory"):
        evaluate_run(tmp_path / "a", overrides=[*overrides, f"eval.ensemble=[{tmp_path / 'z'}]"])


def test_forecast_ensemble_members_may_differ_in_training_only_sampler_options(tmp_path):
    from metadist.datasets import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
    from metadist.eval import evaluate_run
    from metadist.store import ingest
    from metadist.train.__main__ import main

    panel = write_synthetic_panel(
        tmp_path / "panel", num_entities=60, length_range=(90, 120), seed=3, num_files=1
    )
    ingest(
        panel.out_dir,
        tmp_path / "store",
        **{**SYNTHETIC_INGEST_ARGS, "nan": "ffill"},
        progress=False,
    )
    common = [
        "experiment=synthetic_maml",
        f"data.store={tmp_path / 'store'}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=4",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "--no-eval",
    ]
    members = {
        "a": [],
        "recent": ["sampler.options.recent_splits=3", "sampler.options.num_query=2"],
        "horizon": ["sampler.options.horizon=4"],
    }
    for name, extra in members.items():
        assert main([*common, f"run_dir={tmp_path / name}", *extra]) == 0
    overrides = ["eval.max_tasks=8", "eval.scratch_steps=0"]
    both = evaluate_run(
        tmp_path / "a",
        overrides=[*overrides, f"eval.ensemble=[{tmp_path / 'recent'}]"],
        write=False,
    )
    assert str(tmp_path / "recent") in both["settings"]["ensemble"]
    with pytest.raises(ValueError, match="sampler.options"):
        evaluate_run(
            tmp_path / "a", overrides=[*overrides, f"eval.ensemble=[{tmp_path / 'horizon'}]"]
        )


def test_whole_options_of_a_component_named_in_place_of_the_experiments():
    """`sampler.options={...}` is the whole mapping for another sampler too: the
    experiment's own sampler options (synthetic_protonet's num_ways...) were merged into
    it, and a sampler of one's own refused them as unknown."""
    from metadist.train.compose import compose_dict

    base = ["experiment=synthetic_protonet", "sampler.name=random_windows"]
    sampler = compose_dict([*base, "sampler.options={lookback: 32}"])["sampler"]
    assert sampler == {"name": "random_windows", "options": {"lookback": 32}}
    sampler = compose_dict([*base, "sampler.options={lookback: 32}", "sampler.options.horizon=4"])
    assert sampler["sampler"]["options"] == {"lookback": 32, "horizon": 4}
    # without a whole mapping, the experiment's options stay (set one by one on top)
    options = compose_dict([*base, "sampler.options.lookback=30"])["sampler"]["options"]
    assert options["num_ways"] == 5 and options["lookback"] == 30
