"""A command run again under torchrun on N processes of this machine.

`metadist train --nproc-per-node N` and `metadist eval --nproc-per-node N` both start
`python -m metadist.launch.torchrun --standalone --nproc_per_node=N -m
metadist.launch.rank_entry MODULE ARGS` (each rank runs `python -m MODULE ARGS`, quiet
where a Ctrl-C reaches it while it loads) with the command's own arguments (less
`--nproc-per-node`), as children the command owns (`launch.children.OwnedChildren`): a
stop signal reaches torchrun and every rank, and the command says so in one line.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from metadist.launch.children import OwnedChildren, StopRequested

_FLAG = "--nproc-per-node"
# set for torchrun and its ranks where a metadist command started them and reports a stop
OWNER_ENV = "METADIST_RANKS_OWNER"


def without_nproc_flag(argv: Sequence[str]) -> list[str]:
    """`argv` less `--nproc-per-node N` / `--nproc-per-node=N` (what each rank is given)."""
    forwarded: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item == _FLAG:
            skip = True
        elif not item.startswith(_FLAG + "="):
            forwarded.append(item)
    return forwarded


def run_local_ranks(
    module: str, argv: Sequence[str], nproc: int, prog: str, on_stop: str = ""
) -> int:
    """Runs `python -m module` on `nproc` local torchrun ranks with `argv` (less the
    `--nproc-per-node` flag); returns torchrun's exit status, or the stop signal's after
    printing `prog: <what was stopped><on_stop>` on stderr."""
    if stop_reported_by_owner() or "LOCAL_RANK" in os.environ:
        # a rank told to launch ranks would launch them without end
        raise ValueError(
            f"{prog} --nproc-per-node reached a process that is already one of the ranks "
            "of a launch; give --nproc-per-node to the command you start, spelt in full"
        )
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, without its notice
    env[OWNER_ENV] = prog  # a stop is reported once, by this command (`stop_reported_by_owner`)
    command = [
        sys.executable,
        "-m",
        "metadist.launch.torchrun",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "metadist.launch.rank_entry",  # a Ctrl-C while a rank loads: no traceback
        module,
        *without_nproc_flag(argv),
    ]
    try:
        with OwnedChildren(prog) as children:
            status = children.call(command, env=env)
    except StopRequested as stop:
        print(f"{prog}: {stop.summary}{on_stop}", file=sys.stderr)
        return stop.exit_status
    stopped = _stop_signal(status)
    if stopped is not None:  # signalled itself, not through this command: say so here
        print(f"{prog}: its launcher (torchrun) was {stopped}{on_stop}", file=sys.stderr)
    return status


def _stop_signal(status: int) -> str | None:
    """`"stopped by SIGTERM"` (or `"killed by SIGKILL"`) where torchrun's exit `status`
    says a signal ended it (128 + n as it exits on a stop, or -n killed), else `None`."""
    number = -status if status < 0 else status - 128 if status > 128 else 0
    try:
        name = signal.Signals(number).name
    except ValueError:
        return None
    return f"killed by {name}" if status < 0 else f"stopped by {name}"


def stop_reported_by_owner() -> bool:
    """Whether a metadist command started this process's torchrun (`run_local_ranks`)
    and so reports a stop itself: torchrun and the ranks then leave it to that one line."""
    return bool(os.environ.get(OWNER_ENV))
