"""The sbatch script of `metadist slurm submit`: settings, validation and the script itself."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from metadist.cli import main
from metadist.launch.slurm import SlurmJob, job_from_settings, parse_settings, parse_time_limit


def _directives(script: str) -> list[str]:
    return [line[len("#SBATCH ") :] for line in script.splitlines() if line.startswith("#SBATCH ")]


def _torchrun_line(script: str) -> str:
    """The srun … torchrun … command, continuation lines joined."""
    joined = script.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.startswith("srun ")]
    return " ".join(line.split())


def test_dry_run_prints_a_script_with_torchrun_on_every_node(capsys, tmp_path):
    code = main(
        [
            "slurm",
            "submit",
            "experiment=sinusoid_maml",
            "nodes=4",
            "gpus_per_node=8",
            "time=2:00:00",
            "partition=gpu",
            f"run_dir={tmp_path / 'run'}",
            "trainer.meta_steps=1000",
            "trainer.meta_batch_size=32",
            "--dry-run",
        ]
    )
    assert code == 0
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/bash\n")
    directives = _directives(script)
    for expected in (
        "--nodes=4",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--cpus-per-task=8",
        "--time=2:00:00",
        "--partition=gpu",
        "--signal=B:USR1@300",
        "--requeue",
        "--open-mode=append",
        f'--output="{tmp_path / "run"}/slurm/%j.out"',
        "--job-name=metadist-sinusoid_maml",
    ):
        assert expected in directives, (expected, directives)
    command = _torchrun_line(script)
    assert "--ntasks-per-node=1" in command
    assert "-m metadist.launch.torchrun" in command
    assert '--nnodes="$SLURM_NNODES" --nproc_per_node=8' in command
    assert '--rdzv_backend=c10d --rdzv_endpoint="$head_node:$rdzv_port"' in command
    assert command.endswith('-m metadist.train "${train_args[@]}" &')
    # Training overrides keep their order; the run directory is absolute and shared.
    (train_line,) = [ln for ln in script.splitlines() if ln.startswith("train_args=(")]
    args = shlex.split(train_line[len("train_args=(") : -1])
    assert args == [
        "experiment=sinusoid_maml",
        "trainer.meta_steps=1000",
        "trainer.meta_batch_size=32",
        f"run_dir={tmp_path / 'run'}",
    ]
    # The first node of the allocation hosts the rendezvous; USR1 leads to a requeue.
    assert 'head_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in script
    assert "trap on_usr1 USR1" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script
    # Nothing was written by a dry run.
    assert not (tmp_path / "run").exists()


def test_script_is_valid_bash(tmp_path):
    job, _ = job_from_settings(
        ["experiment=x", "nodes=2", "gpus_per_node=0", "nproc_per_node=3", "note=it's spaced out"],
        workdir=str(tmp_path),
    )
    path = tmp_path / "job.sbatch"
    path.write_text(job.render())
    subprocess.run(["bash", "-n", str(path)], check=True)
    # A value with quotes and spaces reaches the training as one argument.
    (train_line,) = [ln for ln in job.render().splitlines() if ln.startswith("train_args=(")]
    assert "note=it's spaced out" in shlex.split(train_line[len("train_args=(") : -1])


def test_cpu_nodes_run_nproc_per_node_processes():
    job, run_dir = job_from_settings(
        ["experiment=x", "gpus_per_node=0", "nproc_per_node=2"], workdir="/shared/work"
    )
    directives = _directives(job.render())
    assert not any(d.startswith("--gpus-per-node") for d in directives)
    assert "--cpus-per-task=2" in directives
    assert "--nproc_per_node=2" in _torchrun_line(job.render())
    # Without run_dir= a fresh time-stamped run directory under the working directory.
    assert re.fullmatch(r"/shared/work/runs/slurm/x-\d{8}-\d{6}", str(run_dir))
    assert f"run_dir={run_dir}" in job.train_args


def test_constraints_may_combine_features():
    job, _ = job_from_settings(["experiment=x", "constraint=[a100|h100]&ib"], workdir="/w")
    assert "--constraint=[a100|h100]&ib" in _directives(job.render())


def test_port_is_pinned_or_derived_from_the_job_id():
    derived, _ = job_from_settings(["experiment=x"], workdir="/w")
    assert "rdzv_port=$((20000 + SLURM_JOB_ID % 20000))" in derived.render()
    pinned, _ = job_from_settings(["experiment=x", "port=29400"], workdir="/w")
    assert "rdzv_port=29400" in pinned.render()


def test_settings_are_split_from_training_overrides():
    settings, overrides = parse_settings(
        ["experiment=e", "nodes=2", "time=10:00", "learner.inner_lr=0.1", "+trainer.x=1"]
    )
    assert settings == {"nodes": 2, "time": "10:00"}
    assert overrides == ["experiment=e", "learner.inner_lr=0.1", "+trainer.x=1"]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 1800),
        ("30:15", 1815),
        ("2:00:00", 7200),
        ("1-0", 86400),
        ("1-2:30", 86400 + 2 * 3600 + 30 * 60),
        ("1-02:30:05", 86400 + 2 * 3600 + 30 * 60 + 5),
    ],
)
def test_parse_time_limit(value, seconds):
    assert parse_time_limit(value) == seconds


@pytest.mark.parametrize("value", ["UNLIMITED", "infinite", "-1", "0", "0:00:00"])
def test_no_time_limit_is_a_time_limit(capsys, tmp_path, value):
    """sbatch reads these as no time limit; they were refused as not a Slurm time limit
    (`0` as leaving no time to train before the checkpoint signal)."""
    assert parse_time_limit(value) is None
    command = ["slurm", "submit", "experiment=sinusoid_maml", f"time={value}"]
    assert main([*command, f"run_dir={tmp_path / 'run'}", "--dry-run"]) == 0
    assert f"--time={value}" in _directives(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["nodes=2"], "experiment=NAME is required"),
        (["experiment=x", "nodes=0"], "nodes must be an integer >= 1"),
        (["experiment=x", "nodes=two"], "nodes must be an integer, got 'two'"),
        (["experiment=x", "nodes=1", "nodes=2"], "nodes is given twice"),
        (["experiment=x", "time=soon"], "time='soon' is not a Slurm time limit"),
        (["experiment=x", "time=4"], "time=4 (240 s) leaves no time to train"),
        (["experiment=x", "gpus_per_node=2", "nproc_per_node=4"], "nproc_per_node=4 is more"),
        (["experiment=x", "port=80"], "port must be in 1024..65535"),
        (["experiment=x", "partition=a b"], "partition='a b' has characters"),
        (["experiment=x", "gpus"], "expected KEY=VALUE, got 'gpus'"),
    ],
)
def test_bad_settings_are_named(tokens, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        job_from_settings(tokens, workdir="/w")


def test_bad_settings_exit_nonzero_from_the_cli(capsys):
    assert main(["slurm", "submit", "experiment=x", "time=4", "--dry-run"]) == 1
    assert "leaves no time to train" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tokens", "messages"),
    [
        (
            [
                "experiment=sinusoid_maml",
                "nodes=2",
                "gpus_per_node=4",
                "trainer.meta_batch_size=25",
            ],
            ["world size 8", "trainer.meta_batch_size=25 is not divisible by the world size 8"],
        ),
        (["experiment=sinusoid"], ["experiment=sinusoid: no such experiment", "sinusoid_maml"]),
        (
            ["experiment=sinusoid_maml", "node=2"],
            ["'node=2' is not a launch setting; did you mean nodes=?", "node: unknown field"],
        ),
    ],
    ids=["indivisible-meta-batch", "unknown-experiment", "misspelt-launch-setting"],
)
def test_configs_the_training_would_reject_stop_before_the_script(
    capsys, tmp_path, tokens, messages
):
    run_dir = tmp_path / "run"
    code = main(["slurm", "submit", *tokens, f"run_dir={run_dir}", "--dry-run"])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    for message in messages:
        assert message in captured.err, (message, captured.err)
    assert not run_dir.exists()


def test_a_meta_batch_that_divides_over_the_ranks_is_accepted(capsys, tmp_path):
    tokens = ["experiment=sinusoid_maml", "nodes=2", "gpus_per_node=4"]
    code = main(
        [
            "slurm",
            "submit",
            *tokens,
            "trainer.meta_batch_size=24",
            f"run_dir={tmp_path}",
            "--dry-run",
        ]
    )
    assert code == 0
    assert "--nproc_per_node=4" in _torchrun_line(capsys.readouterr().out)


def test_an_experiments_directory_of_ones_own_reaches_the_job_and_overrides_may_follow_flags(
    capsys, tmp_path
):
    """`--config-dir` is checked now and passed to the job's training (it was refused as
    an unknown argument); KEY=VALUE after the flags are overrides as before them."""
    import shutil

    mine = tmp_path / "mine"
    shutil.copytree(Path(__file__).resolve().parent.parent / "experiments", mine)
    (mine / "experiment" / "sinusoid_maml.yaml").rename(mine / "experiment" / "my_sine.yaml")
    command = ["slurm", "submit", "experiment=my_sine", f"run_dir={tmp_path / 'run'}"]
    assert main([*command, "--dry-run"]) == 1  # not in the shipped experiments
    assert "experiment=my_sine: no such experiment" in capsys.readouterr().err
    assert main([*command, "--dry-run", "--config-dir", str(mine), "trainer.meta_steps=7"]) == 0
    script = capsys.readouterr().out
    assert f"--config-dir {mine}" in script and "trainer.meta_steps=7" in script


def test_array_jobs_read_each_elements_overrides(tmp_path):
    job = SlurmJob(
        train_args=("experiment=x",),
        output=str(tmp_path / "%a.out"),
        array="0-3%2",
        args_file=str(tmp_path / "${SLURM_ARRAY_TASK_ID}.args"),
    )
    script = job.render()
    assert "--array=0-3%2" in _directives(script)
    assert (
        f'mapfile -t -O "${{#train_args[@]}}" train_args < "{tmp_path}/${{SLURM_ARRAY_TASK_ID}}.args"'
        in script
    )
    with pytest.raises(ValueError, match="array and args_file go together"):
        SlurmJob(train_args=("experiment=x",), output="o", array="0-1")


@pytest.mark.parametrize(
    "place", ["/runs/sp ace", "/runs/exp#1", '/runs/"a"', "/runs/back\\slash", "/runs/it's"]
)
def test_paths_are_quoted_whole_in_the_sbatch_lines(place):
    """`#SBATCH --output=/runs/sp ace/...` was split at the space by sbatch, and ended at
    a `#`: the log and the working directory went elsewhere than the run directory.
    Quoted, with backslashes and quotes escaped, sbatch reads them as a shell would."""
    import shlex

    output, workdir = f"{place}/slurm/%j.out", f"{place}/work"
    directives = _directives(
        SlurmJob(train_args=("experiment=x",), output=output, workdir=workdir).render()
    )
    values = {d.partition("=")[0]: d.partition("=")[2] for d in directives}
    assert shlex.split(values["--output"]) == [output]
    assert shlex.split(values["--chdir"]) == [workdir]


@pytest.mark.parametrize(
    ("output", "workdir", "found"),
    [("/runs/a%b/slurm/%j.out", "/w", "%"), ("/runs/a/slurm/%j.out", "/my\nwork", "\n")],
)
def test_paths_a_sbatch_line_cannot_carry_are_refused(output, workdir, found):
    import re

    wanted = re.escape(f"has {found!r}, which a #SBATCH line does not carry")
    with pytest.raises(ValueError, match=wanted):
        SlurmJob(train_args=("experiment=x",), output=output, workdir=workdir)


def test_a_submission_sbatch_refuses_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    """An sbatch that refuses the script: one line, and neither the script nor the run
    directory the command made is left."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 'sbatch: error: no partition' >&2\nexit 1\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    run_dir = tmp_path / "runs" / "job"
    code = main(["slurm", "submit", "experiment=sinusoid_maml", f"run_dir={run_dir}"])
    assert code == 1
    err = capsys.readouterr().err
    assert "sbatch refused the job: sbatch: error: no partition; nothing was submitted" in err
    assert "job.sbatch" not in err  # not the script just removed
    assert not run_dir.exists()


def test_a_refused_submission_leaves_no_directory_above_the_run(tmp_path, monkeypatch, capsys):
    """The default run directory (runs/slurm/NAME-DATE) is made with its parents: a refusal
    removes those it made too, not only the run directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 'sbatch: error: no partition' >&2\nexit 1\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    assert main(["slurm", "submit", "experiment=sinusoid_maml"]) == 1
    assert "nothing was submitted" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


@pytest.mark.parametrize("python", ["/nowhere/bin/python", "pyhton3", "venv/bin/python"])
def test_an_interpreter_that_is_not_there_is_refused_before_submitting(
    tmp_path, monkeypatch, capsys, python
):
    """A `python=` naming no program was written into the script and submitted: the job
    failed on the nodes once it left the queue. It is one line now, before sbatch."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "sbatch-called"
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {called}\necho 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    command = ["slurm", "submit", "experiment=sinusoid_maml", f"run_dir={run_dir}"]
    for extra in (["--dry-run"], []):
        assert main([*command, f"python={python}", *extra]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and f"python={python!r}: no such program" in err[0], err
    assert not called.exists() and not run_dir.exists()
    # the interpreter running this, by its path or its name on PATH, relative to the job's
    # working directory too, passes
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / "venv" / "bin" / "python")
    assert main([*command, f"python={python}", "--dry-run"]) == (0 if "venv" in python else 1)
    capsys.readouterr()
    assert main([*command, f"python={sys.executable}", "--dry-run"]) == 0
    assert main([*command, "python=sh", "--dry-run"]) == 0
    assert not called.exists()


def test_a_run_dir_that_is_a_file_is_refused_before_the_script(tmp_path, monkeypatch, capsys):
    """A file named as `run_dir=` passed the checks and `--dry-run` printed a script whose
    log went under it; a submission then failed on "…/slurm: not a directory"."""
    (tmp_path / "notes.txt").write_text("mine\n")
    command = ["slurm", "submit", "experiment=sinusoid_maml", "run_dir=notes.txt", "--dry-run"]
    monkeypatch.chdir(tmp_path)
    assert main(command) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        f"run_dir=notes.txt is a file ({tmp_path / 'notes.txt'}), not a directory" in captured.err
    )
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_no_eval_is_passed_to_the_jobs_training(capsys, tmp_path):
    """`--no-eval` was refused as an unknown argument of `metadist slurm submit`: a job's
    training always ended with the held-out evaluation. It is passed on now, and an
    `eval.*` override given with it is refused before the script, as the training would
    refuse it on the nodes."""
    command = ["slurm", "submit", "experiment=sinusoid_maml", f"run_dir={tmp_path / 'run'}"]
    assert main([*command, "--no-eval", "--dry-run"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("train_args="))
    assert line.endswith(" --no-eval)"), line
    assert main([*command, "--dry-run"]) == 0
    assert "--no-eval" not in capsys.readouterr().out
    assert main([*command, "eval.max_tasks=3", "--no-eval", "--dry-run"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines() == [
        "metadist slurm: error: 'eval.max_tasks=3' sets the evaluation, which --no-eval turns off"
    ]
    assert not (tmp_path / "run").exists()


def test_bad_evaluation_settings_are_refused_at_submission(capsys, tmp_path):
    """The job's training evaluates at its end, and `metadist train` checks `eval.*`
    before it trains; a submitted job did not, so `eval.max_tasks=-1` failed on the nodes
    after the queue and the whole training. It is one line before the script now (and
    not checked where `--no-eval` turns the evaluation off)."""
    command = ["slurm", "submit", "experiment=sinusoid_maml", f"run_dir={tmp_path / 'run'}"]
    assert main([*command, "eval.max_tasks=-1", "--dry-run"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines() == [
        "metadist slurm: error: eval.max_tasks must be >= 1 or null, got -1"
    ]
    assert not (tmp_path / "run").exists()
    assert main([*command, "eval.max_tasks=5", "--dry-run"]) == 0
