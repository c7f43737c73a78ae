"""`python -m metadist.launch.torchrun ARGS`: torchrun (`torch.distributed.run`), stopped
by a signal with one line instead of a traceback.

torchrun turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into an exception: it stops its
workers (which checkpoint on SIGTERM), then the exception ends the process with a
traceback of torchrun's own frames. That is what a Slurm requeue, a preemption or
Ctrl-C left in a job's log. Here the workers are stopped the same way; the launcher then
says which signal stopped it and exits with 128 + the signal's number, as a shell does.
A training process that fails is named in one line too (rank and exit status; its own
message comes before), with exit status 1, where torchrun prints a traceback and a table.
Every argument is torchrun's.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        how = (
            f"was killed by {failure.signal_name()}"
            if failure.exitcode < 0
            else f"exited with status {failure.exitcode}"
        )
        print(
            f"torchrun: the training process of rank {rank} {how} (its own message is "
            "above); the others were stopped",
            file=sys.stderr,
        )
        return 1
    except SignalException as stopped:
        number = int(stopped.sigval)
        print(
            f"torchrun: stopped by {signal.Signals(number).name}; its training processes "
            "were stopped first",
            file=sys.stderr,
        )
        return 128 + number
    return 0


if __name__ == "__main__":
    sys.exit(main())
