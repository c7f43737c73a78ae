"""`metadist competition` writes only into a new or empty directory or an earlier output
of its own for the same data (issue 39: `--out ../x/..` wrote into whatever it named)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from competition_data import write_competition

from metadist.commands import competition
from metadist.commands.competition import panels, pipeline
from metadist.commands.competition.output import OUTPUT_FILE


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_competition(tmp_path_factory.mktemp("competition") / "data")


def _listing(root: Path) -> list[tuple[str, int]]:
    """Every path under `root` with its size (directories 0), sorted."""
    return sorted(
        (str(p.relative_to(root)), 0 if p.is_dir() else p.stat().st_size) for p in root.rglob("*")
    )


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", "competition", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
@pytest.mark.slow  # 12-21 s: `make test` stays under 10 minutes (`make test-slow` runs it)
def test_an_out_resolving_to_a_foreign_directory_is_refused_by_the_cli(data_dir, tmp_path):
    home = tmp_path / "home"
    (home / "x").mkdir(parents=True)
    (home / "notes.txt").write_text("mine\n")
    (home / "work").mkdir()
    data = Path(shutil.copytree(data_dir, home / "data"))
    before = _listing(tmp_path)
    cases = {
        "../x/..": "is a non-empty directory that is not an output of metadist competition",
        str(data): "is a non-empty directory that is not an output of metadist competition",
        "../notes.txt": "exists and is not a directory",
    }
    for out, message in cases.items():
        done = _cli([str(data), "--out", out, "--ets", "no"], cwd=home / "work")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
        assert len(lines) == 1 and "Traceback" not in done.stderr, lines
        assert f"--out {out} " in lines[0] and message in lines[0], lines
    assert _listing(tmp_path) == before  # nothing written anywhere


@pytest.mark.integration
def test_a_default_output_that_is_not_a_competition_output_is_refused(data_dir, tmp_path):
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    (data / "competition.yaml").write_text("name: taken\n")
    work = tmp_path / "work"
    (work / "runs" / "taken").mkdir(parents=True)
    (work / "runs" / "taken" / "thesis.tex").write_text("months of work\n")
    before = _listing(tmp_path)
    done = _cli([str(data), "--ets", "no"], cwd=work)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--out runs/taken " in lines[0], lines
    assert _listing(tmp_path) == before


def _stop_at_ingest(monkeypatch) -> None:
    """The pipeline stops at its first subprocess (the ingest): what comes before is
    what is tested, in-process."""
    monkeypatch.setattr(panels, "run_command", lambda title, command, env: 1)
    monkeypatch.setattr(pipeline, "train_members", lambda *args: 1)


def test_a_new_or_empty_out_is_claimed_and_its_own_output_accepted_again(
    data_dir, tmp_path, monkeypatch, capsys
):
    _stop_at_ingest(monkeypatch)
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "new" / "deeper", empty):
        assert competition.main([str(data), "--out", str(out), "--ets", "no"]) == 1
        marker = json.loads((out / OUTPUT_FILE).read_text())
        assert marker["data"] == str((data / "train.parquet").resolve())
        assert marker["protocol"] == "test"
        (out / "store").mkdir()  # no longer empty: its marker makes it the same output
        (out / "metrics.md").write_text("| table |\n")
        capsys.readouterr()
        assert competition.main([str(data), "--out", str(out), "--ets", "no"]) == 1
        assert "--out" not in capsys.readouterr().err  # stopped at the ingest, not refused
    val = tmp_path / "val"
    assert competition.main([str(data), "--validation", "--out", str(val), "--ets", "no"]) == 1
    assert json.loads((val / OUTPUT_FILE).read_text())["protocol"] == "validation"
    assert (val / "validation_data" / "train.parquet").is_file()


@pytest.mark.parametrize(
    "marker, message",
    [
        ({"protocol": "validation"}, "is the output of a validation run, this is a test run"),
        ({"data": "/elsewhere/train.parquet"}, "is the competition output of /elsewhere/"),
        ({"kind": "something else"}, f"{OUTPUT_FILE} there is not the marker"),
        (None, f"{OUTPUT_FILE} there is not the marker"),
    ],
)
def test_an_output_of_other_data_or_another_protocol_is_refused(
    data_dir, tmp_path, monkeypatch, capsys, marker, message
):
    _stop_at_ingest(monkeypatch)
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    out = tmp_path / "out"
    assert competition.main([str(data), "--out", str(out), "--ets", "no"]) == 1
    document = json.loads((out / OUTPUT_FILE).read_text())
    (out / "keep.txt").write_text("x")
    if marker is None:
        (out / OUTPUT_FILE).write_text("{not json")
    else:
        (out / OUTPUT_FILE).write_text(json.dumps({**document, **marker}))
    before = _listing(out)
    capsys.readouterr()
    assert competition.main([str(data), "--out", str(out), "--ets", "no"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {out}" in err[0] and message in err[0], err
    assert _listing(out) == before


def test_an_output_of_an_earlier_version_is_adopted_only_for_the_same_file(
    data_dir, tmp_path, monkeypatch, capsys
):
    """Outputs written before the marker: adopted while their store or validation split
    records the training file as it is now."""
    from metadist.commands.competition.sources import file_fingerprint

    _stop_at_ingest(monkeypatch)
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    out = tmp_path / "old"
    (out / "store").mkdir(parents=True)
    fingerprint = file_fingerprint(data / "train.parquet")
    metadata = {"source": {"fingerprint": fingerprint}}
    (out / "store" / "metadata.json").write_text(json.dumps(metadata))
    assert competition.main([str(data), "--out", str(out), "--ets", "no"]) == 1
    assert (out / OUTPUT_FILE).is_file()  # adopted and marked; stopped at the ingest's check
    other = tmp_path / "other"
    (other / "store").mkdir(parents=True)
    metadata = {"source": {"fingerprint": "0" * 16}}
    (other / "store" / "metadata.json").write_text(json.dumps(metadata))
    capsys.readouterr()
    assert competition.main([str(data), "--out", str(other), "--ets", "no"]) == 1
    assert "is a non-empty directory that is not an output" in capsys.readouterr().err
    assert not (other / OUTPUT_FILE).exists()


def test_an_empty_out_is_refused_not_taken_for_the_working_directory(data_dir, capsys):
    with pytest.raises(SystemExit) as stopped:
        competition.main([str(data_dir), "--out", "", "--ets", "no"])
    assert stopped.value.code == 2
    assert "argument --out: an empty --out names no directory" in capsys.readouterr().err
