"""`metadist demo` checks its training settings as `metadist train --nproc-per-node`
does: a bad training override is one line before the panel is written, and settings the
ranks would refuse on the demo's store (a panel too short for one task) are one line
before torchrun starts, not a rank's line, torchrun's report and the demo's after it."""

import pytest

from metadist import demo

pytestmark = pytest.mark.integration

SMALL = ["--entities", "30", "--meta-steps", "1", "--nproc", "2"]


@pytest.mark.timeout(120)
def test_a_bad_training_override_is_one_line_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "demo"
    code = demo.main(["--out", str(out), *SMALL, "--length-range", "120", "160", "trainer.bogus=1"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("metadist demo: error: trainer.bogus: unknown field"), err
    assert not out.exists()


@pytest.mark.timeout(120)
def test_settings_the_ranks_would_refuse_are_one_line_before_torchrun(tmp_path, capsys):
    out = tmp_path / "demo"
    code = demo.main(["--out", str(out), *SMALL, "--length-range", "10", "20"])
    assert code == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("metadist demo: error: sampler: "), err
    assert "long enough for one task" in err[0], err
    assert not (out / "run" / "checkpoints").exists()


def test_an_nproc_the_demos_batch_does_not_split_over_names_the_flag(tmp_path, capsys):
    """`--nproc 3` was refused naming `trainer.meta_batch_size=16`, a setting the demo
    sets itself and the user never gave; the line names --nproc and the counts that work."""
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--entities", "30", "--nproc", "3"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "metadist demo: error: --nproc 3: the demo's meta-batch of 16 tasks does not split "
        "evenly over 3 processes; use --nproc 1, 2, 4, 8 or 16, or give "
        "trainer.meta_batch_size=M with M a multiple of 3"
    ]
    assert not out.exists()
