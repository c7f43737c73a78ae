"""Ctrl-C in `metadist eval` while it scores (the from-scratch baseline's training, the
statistical forecasts' worker processes beside it) is one line, `metadist eval:
interrupted; ...`, exit status 130; it was a `KeyboardInterrupt` traceback from whatever
the evaluation was computing, and one from each worker of the statistical forecasts."""

import os
import signal
import subprocess
import sys
import time

import pytest
from tiny_runs import tiny_store, train_tiny

pytestmark = pytest.mark.integration

CLI = "import sys; from metadist.cli import main; sys.exit(main())"


@pytest.mark.timeout(180)
def test_ctrl_c_while_evaluating_is_one_line(tmp_path):
    store = tiny_store(tmp_path, 200, seed=0)
    run_dir = train_tiny(store, tmp_path / "run", "experiment=synthetic_maml")
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        # a from-scratch baseline long enough to be under way when Ctrl-C comes
        [sys.executable, "-c", CLI, "eval", f"run_dir={run_dir}", "--no-shared-cache",
         "eval.scratch_steps=1000000"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        for line in process.stderr:  # the cost line: the evaluation has begun
            if line.startswith("evaluation: "):
                break
        time.sleep(1.5)  # the statistical forecasts' workers started too, as a rule
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=150)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, err[-3000:]
    lines = [line for line in err.strip().splitlines() if not line.startswith("from scratch")]
    assert lines == ["metadist eval: interrupted; run the same command again to evaluate"], err
