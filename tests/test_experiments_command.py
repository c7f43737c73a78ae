"""`metadist experiments list | copy`: what ships, and a copy that trains as it is."""

import subprocess
import sys
from pathlib import Path

import yaml

from metadist.cli import main
from metadist.configs import copy_experiments, find_experiments_dir, list_experiments
from metadist.train.compose import compose_dict

SHIPPED = Path(__file__).resolve().parents[1] / "experiments"


def test_list_names_every_experiment_file_with_its_summary(capsys):
    assert main(["experiments", "list"]) == 0
    out = capsys.readouterr().out
    names = sorted(path.stem for path in (SHIPPED / "experiment").glob("*.yaml"))
    assert len(names) >= 5
    for name in names:
        assert f"  {name} " in out
    assert "sinusoid regression" in out  # the summary comes from the file's comment


def test_list_does_not_import_torch():
    code = (
        "import sys; from metadist.cli import main; main(['experiments', 'list']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_a_copy_composes_the_same_config_and_keeps_edits(tmp_path, capsys):
    destination = tmp_path / "mine"
    assert main(["experiments", "copy", "sinusoid_maml", str(destination)]) == 0
    assert "--config-dir" in capsys.readouterr().out
    assert (destination / "config.yaml").is_file()
    original = compose_dict(["experiment=sinusoid_maml"], SHIPPED)
    copied = compose_dict(["experiment=sinusoid_maml"], destination)
    assert copied == original
    edited = destination / "experiment" / "sinusoid_maml.yaml"
    config = yaml.safe_load(edited.read_text())
    config["trainer"]["meta_steps"] = 7
    edited.write_text("# @package _global_\n" + yaml.safe_dump(config))
    assert compose_dict(["experiment=sinusoid_maml"], destination)["trainer"]["meta_steps"] == 7


def test_copy_refuses_an_unknown_name_and_an_existing_destination(tmp_path, capsys):
    assert main(["experiments", "copy", "sinusoid_mam", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert "did you mean 'sinusoid_maml'" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()
    existing = tmp_path / "b"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    assert main(["experiments", "copy", "sinusoid_maml", str(existing)]) == 1
    assert "exists" in capsys.readouterr().err
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]


def test_list_reads_the_directory_it_is_given(tmp_path):
    copy_experiments(find_experiments_dir(SHIPPED), tmp_path / "c")
    (tmp_path / "c" / "experiment" / "mine.yaml").write_text("# My own run. More.\n")
    names = {e.name: e.summary for e in list_experiments(tmp_path / "c")}
    assert names["mine"] == "My own run"


def test_list_shows_whole_summaries_and_every_learner(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["experiments", "list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    # the end of ucr_maml_plus's long first sentence, once cut
    assert "first order for the first 300 (cheaper, and steadier early)" in " ".join(out.split())
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("learner=NAME: "))
    wrapped = [lines[start]]  # the list wraps at the terminal's width: indented lines go on
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        wrapped.append(line.strip())
    learners = " ".join(wrapped)
    shipped = sorted(p.stem for p in (SHIPPED / "learner").glob("*.yaml"))
    assert "metabaseline_ft" in shipped
    assert learners == "learner=NAME: " + ", ".join(shipped)
