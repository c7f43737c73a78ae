"""The benchmark scripts refuse a bad argument in one line, before any work, and their
`--help` says what each measures (the docstring's whole first paragraph)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _benchmark_scripts import BENCHMARKS, run_script, script_module
from _task_stores import build_encoded_store

SCRIPTS = sorted(
    path.stem for path in BENCHMARKS.glob("*.py") if path.stem not in ("arguments", "written")
)


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "afile"
    path.write_text("not a directory\n")
    return path


CASES = [
    ("synth", ["--sizes-mb", "-5", "--dir", "{tmp}/synth"], "--sizes-mb: -5 is not a number > 0"),
    ("synth", ["--sizes-mb", "1", "--dir", "{afile}"], "is a file, not a directory"),
    ("loader", ["--workdir", "{afile}"], "--workdir: {afile} is a file"),
    ("larger_than_memory", ["--store", "{tmp}/none", "--dir", "{tmp}/ltm"], "not a series store"),
    ("ingest", ["--work-dir", "{afile}"], "--work-dir: {afile} is a file"),
    ("ingest", ["--workers", "a,1", "--work-dir", "{tmp}/ingest"], "--workers: a is not a whole"),
    ("entity_ids", ["--dir", "{afile}"], "--dir: {afile} is a file"),
    ("learners", ["--threads", "0"], "--threads: 0 is not a whole number >= 1"),
    ("learners", ["--workloads", "sinusoid"], "'sinusoid' is not a workload"),
    ("gpu", ["--device", "cpu", "--workloads", "mlp-4"], "'mlp-4' is not a workload"),
    ("gpu", ["--device", "gpu"], "--device gpu: not a device"),
    # no warm-up step left the runner's reading None: AttributeError after the setup
    ("gpu", ["--device", "cpu", "--workloads", "sinusoid-4", "--warmup", "0"],
     "--warmup: 0 is not a whole number >= 1"),
    ("scratch", ["--rounds", "0"], "--rounds: 0 is not a whole number >= 1"),
    ("sinusoid_reproduction", ["--steps", "2", "--out", "{afile}"], "is a file, not a directory"),
    ("maml_inner_dev", ["{tmp}/none"], "no run directory"),
    ("maml_inner_dev", ["{tmp}/none", "--candidates", "sgd"], "'sgd' is not sgd:LR or adam:LR"),
    ("cross_protocol", [*("--data", "{tmp}/none", "--label", "yearly"),
                        *("--validation", "{tmp}/v", "--test", "{tmp}/t")], "--data {tmp}/none"),
    ("guard_rescore", ["--metric", "smape", "--validation", "6", "--test", "6=r"],
     "'6' is not H=loss:RUN,loss:RUN"),
    ("macro_panel", ["{afile}"], "out: {afile} is a file"),
]  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("script", "args", "says"), CASES, ids=lambda c: str(c)[:40])
def test_a_bad_argument_is_one_line_before_any_work(
    script, args, says, tmp_path, afile, monkeypatch
):
    def fill(text: str) -> str:
        return text.format(tmp=tmp_path, afile=afile)

    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    status, out, err = run_script(script, [fill(a) for a in args], monkeypatch)
    assert status != 0
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert fill(says) in err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.timeout(120)
def test_fewshot_refuses_unknown_learners_and_jobs_before_training(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "data" / "toy").mkdir(parents=True)
    build_encoded_store(out / "data" / "toy", [60] * 40)  # a prepared set: 4 classes
    base = ["--sets", "toy", "--shots", "1", "--out", str(out)]
    status, _, err = run_script("fewshot", [*base, "--jobs", "0"], monkeypatch)
    assert status == 2 and err.strip().endswith("(usage: fewshot.py --help)")
    assert "--jobs: 0 is not a whole number >= 1" in err and len(err.splitlines()) == 1
    status, _, err = run_script("fewshot", [*base, "--learners", "protonett"], monkeypatch)
    assert status == 2 and "--learners protonett: no such recipe; one of" in err
    status, _, err = run_script("fewshot", ["--sets", "NoSuch", "--out", str(out)], monkeypatch)
    assert status == 2 and "--sets NoSuch: not an installed UCR/UEA set" in err
    assert len(err.splitlines()) == 1
    assert not (out / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_says_what_the_script_measures(script, monkeypatch):
    module = script_module(script)
    first = module.__doc__.strip().split("\n\n")[0]
    status, out, _ = run_script(script, ["--help"], monkeypatch)
    assert status == 0
    # the whole paragraph, however argparse wraps (and hyphenates) it
    assert "".join(first.split()) in "".join(out.split())


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_script_run_from_the_shell_says_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "loader.py"), "--entities", "-1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "loader.py: error: argument --entities: -1 is not a whole number >= 1 "
        "(usage: loader.py --help)"
    ]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_maml_inner_dev_refuses_a_run_without_a_maml_inner_loop(tmp_path, monkeypatch):
    from metadist.cli import main

    (tmp_path / "data").mkdir()
    build_encoded_store(tmp_path / "data", [60] * 40)  # 4 classes of 10 cases
    run_dir = tmp_path / "protonet"
    trained = main(
        [
            *("train", "experiment=ucr_protonet", f"data.store={tmp_path / 'data' / 'store'}"),
            *(f"run_dir={run_dir}", "data.split_by=label", "sampler.options.num_ways=2"),
            *("sampler.options.num_shots=1", "trainer.meta_steps=2", "trainer.eval_every=0"),
            *("logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"),
        ]
    )
    assert trained == 0
    status, _, err = run_script("maml_inner_dev", [str(run_dir), "--max-tasks", "2"], monkeypatch)
    assert status == 1
    assert err.splitlines() == [
        f"maml_inner_dev: error: {run_dir} trained 'protonet', which has no MAML inner loop "
        "to tune (a run of learner maml or anil has)"
    ]


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the checks would run")
def test_gpu_check_refuses_a_machine_without_a_gpu_before_any_step(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), str(tmp_path / "baseline"), str(out)],
        capture_output=True,
        text=True,
        cwd=BENCHMARKS.parent,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=170,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"gpu_check.sh: no GPU is visible to {sys.executable}'s torch; run it on the GPU machine"
    ]
    assert done.stdout == "" and not out.exists()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_m3_checks_the_competition_options_before_writing_m3(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, err = run_script("m3", ["--seeds", "0", "--jobs", "1"], monkeypatch)
    assert status == 2
    assert err.splitlines() == [
        "benchmarks/m3.py: error: --seeds must be >= 1, got 0 (usage: benchmarks/m3.py --help)"
    ]
    assert list(tmp_path.iterdir()) == []  # M3 not written to data/m3


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_fewshot_a_failed_training_is_one_line_with_its_reason(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "data" / "toy").mkdir(parents=True)
    build_encoded_store(out / "data" / "toy", [60] * 40)
    args = ["--sets", "toy", "--shots", "1", "--learners", "protonet", "--out", str(out)]
    status, _, err = run_script("fewshot", [*args, "trainer.nosuch=1"], monkeypatch)
    assert status == 1
    run_dir = out / "runs" / "toy_protonet_2way_1shot"
    assert err.splitlines() == [
        f"benchmarks/fewshot.py: the training of {run_dir} failed: metadist-train: error: "
        + err.split("metadist-train: error: ", 1)[1].strip()
    ]
    assert "trainer.nosuch: unknown field" in err


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_fewshot_says_each_run_as_it_finishes(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "data" / "toy").mkdir(parents=True)
    build_encoded_store(out / "data" / "toy", [60] * 40)
    args = ["--sets", "toy", "--shots", "1", "--learners", "protonet", "--out", str(out)]
    tiny = ["trainer.meta_steps=2", "eval.max_tasks=4", "eval.scratch_steps=1"]
    status, printed, err = run_script(
        "fewshot", [*args, *tiny, "eval.pretrain_steps=1"], monkeypatch
    )
    assert status == 0, err
    progress = [line for line in printed.splitlines() if line.startswith("# 1/1: ")]
    assert len(progress) == 1 and progress[0].startswith("# 1/1: toy_protonet_2way_1shot (")
    assert printed.index(progress[0]) < printed.index("| set |")  # before the table
    status, printed, _ = run_script("fewshot", [*args, *tiny], monkeypatch)
    assert "# 1/1: toy_protonet_2way_1shot (read back)" in printed.splitlines()
