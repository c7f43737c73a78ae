"""A rank of a command's local launch, stopped quietly by a Ctrl-C that comes while it loads.

`python -m metadist.launch.rank_entry MODULE ARGS` runs `python -m MODULE ARGS`. A
command run on N local ranks (`launch.local_ranks`) starts its ranks so: its Ctrl-C
reaches them through torchrun, and one that arrives while a rank still imports torch
(seconds) would print a `KeyboardInterrupt` traceback from every rank, beside the
command's own line saying what it stopped. Here such a rank exits with 130 and nothing
on stderr. This module imports nothing of metadist, so it is loaded before a Ctrl-C can
come.
"""

from __future__ import annotations

import runpy
import signal
import sys


def main() -> int:
    """Runs `sys.argv[1]` as `__main__` with the arguments after it; 130 where a Ctrl-C
    reached it uncaught (the launching command reports the stop)."""
    if len(sys.argv) < 2:
        print("usage: python -m metadist.launch.rank_entry MODULE [ARGS...]", file=sys.stderr)
        return 2
    sys.argv = sys.argv[1:]
    try:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(main())
