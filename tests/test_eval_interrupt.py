"""Ctrl-C in `metadist eval` while it scores (the from-scratch baseline's training, the
statistical forecasts' worker processes beside it) is one line, `metadist eval:
interrupted; ...`, exit status 130; it was a `KeyboardInterrupt` traceback from whatever
the evaluation was computing, and one from each worker of the statistical forecasts."""

import sys

import pytest
from interrupts import interrupt_after
from tiny_runs import tiny_store, train_tiny

pytestmark = pytest.mark.integration

CLI = "import sys; from metadist.cli import main; sys.exit(main())"


@pytest.mark.timeout(180)
def test_ctrl_c_while_evaluating_is_one_line(tmp_path):
    store = tiny_store(tmp_path, 200, seed=0)
    run_dir = train_tiny(store, tmp_path / "run", "experiment=synthetic_maml")
    # a from-scratch baseline long enough to be under way when Ctrl-C comes; after the
    # cost line (the evaluation has begun), the statistical forecasts' workers start too
    argv = [sys.executable, "-c", CLI, "eval", f"run_dir={run_dir}", "--no-shared-cache"]
    argv.append("eval.scratch_steps=1000000")
    status, err = interrupt_after(argv, tmp_path, "evaluation: ", "stderr", wait_s=1.5)
    assert status == 130, err[-3000:]
    lines = [line for line in err.strip().splitlines() if not line.startswith("from scratch")]
    assert lines == ["metadist eval: interrupted; run the same command again to evaluate"], err
