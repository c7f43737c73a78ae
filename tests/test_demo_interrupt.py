"""Ctrl-C in `metadist demo` is one line from the demo, whatever it was doing: while it
wrote the panel or built the store it was a `KeyboardInterrupt` traceback; in
meta-training the ranks and torchrun each added their own line (`metadist-train:
interrupted ...`, `torchrun: stopped by SIGINT ...`) beside the demo's, and a Ctrl-C
while a rank imported torch printed that rank's traceback."""

import sys

import pytest
from interrupts import interrupt_after

pytestmark = pytest.mark.integration

CLI = "import sys; from metadist.cli import main; sys.exit(main())"


def _interrupt_after(tmp_path, marker: str, demo_args: list[str], wait_s: float = 0.0):
    """`metadist demo` given Ctrl-C once a line of its output starts with `marker`."""
    argv = [sys.executable, "-c", CLI, "demo", "--out", str(tmp_path / "demo"), *demo_args]
    return interrupt_after(argv, tmp_path, marker, wait_s=wait_s)


@pytest.mark.timeout(180)
def test_ctrl_c_while_the_panel_is_written_is_one_line(tmp_path):
    # a panel large enough that writing it takes seconds
    args = ["--entities", "3000", "--length-range", "900", "1000", "--nproc", "1"]
    status, err = _interrupt_after(tmp_path, "== 1.", args)
    lines = err.strip().splitlines()
    assert status == 130, err[-3000:]
    assert lines == ["metadist demo: interrupted; run it again to resume"], err[-3000:]


@pytest.mark.timeout(180)
def test_ctrl_c_in_meta_training_is_the_demos_line_alone(tmp_path):
    args = ["--entities", "30", "--length-range", "120", "160", "--meta-steps", "100000"]
    status, err = _interrupt_after(tmp_path, "$ python", args, wait_s=1.0)
    lines = err.strip().splitlines()
    assert status == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not [line for line in lines if line.startswith(("torchrun:", "metadist-train"))], err
    assert lines[-1].startswith("metadist demo: ") and "run it again to resume" in lines[-1], err
