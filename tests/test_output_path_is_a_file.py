"""An output path below a file is one line naming the path: `metadist demo --out
afile/x` was a NotADirectoryError traceback from `mkdir`, `metadist demo --out afile` the
bare `[Errno 17] File exists: 'afile'`, and `metadist experiments copy NAME afile/x`
named its temporary staging directory (`afile/.x.copying-PID`) instead of DEST."""

import pytest

from metadist import demo
from metadist.cli import main

pytestmark = pytest.mark.integration

SMALL = ["--entities", "30", "--length-range", "120", "160", "--meta-steps", "1", "--nproc", "1"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("below", ["", "x"])
def test_demo_out_at_or_below_a_file(tmp_path, capsys, monkeypatch, below):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    out = "afile/" + below if below else "afile"
    assert demo.main(["--out", out.rstrip("/"), *SMALL]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("metadist demo: error: "), err
    assert "afile" in err[0] and "not a directory" in err[0], err
    assert "Errno" not in err[0], err
    assert (tmp_path / "afile").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_experiments_copy_below_a_file_names_dest(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    assert main(["experiments", "copy", "synthetic_maml", "afile/x"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["metadist experiments: error: cannot create afile/x: afile is not a directory"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
