"""`metadist demo` again in the same --out with other training settings (`learner=metasgd`
after a default run): one line naming the setting and the remedy that works for the demo
(another --out, not the training's `run_dir=`, which the demo refuses), before any
training is started, so no "meta-training took" line either."""

import argparse

import pytest
from tiny_runs import train_tiny

from metadist import demo
from metadist.store import SeriesStore
from metadist.train.rerun_check import check_same_settings

pytestmark = pytest.mark.integration

SETTINGS = ["--entities", "30", "--length-range", "120", "160", "--seed", "0"]


@pytest.mark.timeout(300)
def test_other_training_settings_name_another_out(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    spec = argparse.Namespace(entities=30, length_range=(120, 160), seed=0)
    store_path = demo.prepare_store(out, spec)
    train_tiny(SeriesStore.open(store_path), out / "run", "experiment=synthetic_maml")
    capsys.readouterr()

    code = demo.main(
        ["--out", str(out), *SETTINGS, "--meta-steps", "4", "--nproc", "1", "learner=metasgd"]
    )
    assert code == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("metadist demo: error: "), err
    assert "learner.name='metasgd'" in err[0] and "another --out" in err[0], err
    assert "run_dir=" not in err[0], err
    assert "meta-training took" not in captured.out
    # the same settings pass the check: the demo resumes or confirms the run, as before
    same = ["experiment=synthetic_maml", f"data.store={store_path}", f"run_dir={out / 'run'}"]
    check_same_settings(same, out / "run", "another --out")
