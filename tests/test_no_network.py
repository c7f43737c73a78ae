"""Nothing opens a network connection unless asked: wandb offline or disabled stays local.

A short training runs as a real process with wandb offline (the default) and no
`WANDB_MODE` in its environment, inside a network namespace without interfaces where
`unshare -n` is permitted. Two witnesses record any connection outside the loopback:
the socket guard of `tests/netguard` (every Python `connect` and name lookup) and, where
`strace` can trace, every `connect` of the whole process tree (wandb's own service is
not Python).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metadist.train import load_config, train
from metadist.train.logging import wandb_mode

GUARD_DIR = Path(__file__).parent / "netguard"
RUN = [
    "experiment=sinusoid_maml",
    "trainer.meta_steps=30",
    "sampler.options.num_tasks=40",
    "model.options.hidden_sizes=[8]",
    "trainer.meta_batch_size=4",
    "trainer.eval_every=10",
    "trainer.eval_batches=2",
    "logging.progress=false",
]


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _outside_loopback(strace_text: str) -> list[str]:
    """The `connect` lines of an strace log whose address is not a loopback one."""
    found = []
    for line in strace_text.splitlines():
        if "connect(" not in line or not re.search(r"AF_INET6?\b", line):
            continue
        match = re.search(r'inet_(?:addr|pton)\((?:AF_INET6?, )?"([^"]+)"', line)
        if match is None or not ipaddress.ip_address(match.group(1)).is_loopback:
            found.append(line.strip())
    return found


@pytest.mark.timeout(300)
def test_an_offline_run_opens_no_connection_outside_the_loopback(tmp_path):
    guard_log = tmp_path / "guard.log"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GUARD_DIR), env.get("PYTHONPATH")]))
    env["METADIST_NETGUARD_LOG"] = str(guard_log)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "metadist.train", *RUN, f"run_dir={run_dir}"]
    strace_log = tmp_path / "strace.log"
    if shutil.which("strace") and _works(["strace", "-f", "-o", os.devnull, "true"]):
        argv = ["strace", "-f", "-e", "trace=connect", "-o", str(strace_log), *argv]
    if shutil.which("unshare") and _works(["unshare", "-n", "true"]):
        argv = ["unshare", "-n", *argv]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "wandb").is_dir()  # wandb did run, offline
    # ... and kept its own console lines (banner, run history, sync hints) out of the
    # run's output (logging.wandb.quiet, the default)
    output = done.stdout + done.stderr
    assert "wandb:" not in output, output[-3000:]
    assert "finished 30 meta-steps" in output
    assert not guard_log.exists(), guard_log.read_text()
    if strace_log.exists():
        assert _outside_loopback(strace_log.read_text()) == []


def test_wandb_mode_disabled_in_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = load_config(
        [*RUN, "trainer.meta_steps=2", "logging.wandb.mode=offline", f"run_dir={tmp_path}"],
        world_size=1,
    )
    train(config)
    assert (tmp_path / "metrics.jsonl").exists()
    assert not (tmp_path / "wandb").exists()


def test_the_environment_only_restricts_the_mode():
    assert wandb_mode("online", {"WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode("offline", {"WANDB_MODE": "online"}) == "offline"
    assert wandb_mode("online", {"WANDB_MODE": "dryrun"}) == "offline"
    assert wandb_mode("offline", {}) == "offline"
    with pytest.raises(ValueError, match="WANDB_MODE='sometimes'"):
        wandb_mode("offline", {"WANDB_MODE": "sometimes"})
