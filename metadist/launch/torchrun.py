"""`python -m metadist.launch.torchrun ARGS`: torchrun (`torch.distributed.run`), stopped
by a signal with one line instead of a traceback.

torchrun turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into an exception: it stops its
workers (which checkpoint on SIGTERM), then the exception ends the process with a
traceback of torchrun's own frames. That is what a Slurm requeue, a preemption or
Ctrl-C left in a job's log. Here the workers are stopped the same way; the launcher then
says which signal stopped it and exits with 128 + the signal's number, as a shell does
(where a metadist command started it, that command's own line says so instead, and
torchrun's warnings of the signal passed on to each worker are left out either way).
A training process that fails is named in one line too (rank and exit status; its own
message comes before), with exit status 1, where torchrun prints a traceback and a table.
The ranks that fail only because they lost that one (a gloo "Connection reset by peer"
in their next collective) are named in the same line, their tracebacks left out
(`metadist.launch.rank_reports`). Every argument is torchrun's.

torchrun keeps its workers' error files in a log directory which, unless `--log-dir` (or
`PET_LOG_DIR`) names one, it makes in the temporary directory and leaves behind: one
`torchelastic_*` tree a run. Here that directory is the launcher's own, removed when
torchrun is done with it (after a failure is read from it).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

from metadist.launch.local_ranks import stop_reported_by_owner
from metadist.launch.rank_reports import RankReports, collapsed, last_line, short, write_all
from metadist.rank_message import unsaid_line
from metadist.stop_signals import Stopped, stops_raised

# torchrun's warnings on a stop signal (one per worker), its error log of a failed worker
# (the one line of `_failure_line` says it), that it has no error file of its own to copy
# the worker's into (the worker's line, `metadist.rank_message`, is said here), and the
# loggers they come from
_STOP_NOTICES = (
    "Received %s death signal",
    "Sending process %s closing signal",
    "failed (exitcode: %s)",
    "no error file defined for parent",
)
_STOP_LOGGERS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.multiprocessing.errors.error_handler",
)
# a rank's lost-peer report this close before its failure was detected (s) is that failure
_LOST_PEER_WINDOW_S = 10.0


def main(argv: list[str] | None = None) -> int:
    try:
        from torch.distributed import DistNetworkError
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun_main
    except KeyboardInterrupt:  # Ctrl-C while torch is imported
        return _stopped_early(None)
    _quiet_stop_notices()
    argv, log_dir = _with_log_dir(sys.argv[1:] if argv is None else list(argv))
    reports = RankReports.start()
    try:
        with stops_raised():  # SIGTERM before torchrun sets its handlers (rendezvous)
            torchrun_main(argv)
    except ChildFailedError as failed:
        held = reports.finish() if reports else {}
        lost_at = reports.lost_at if reports else {}
        raised = reports.raised if reports else set()
        print(_failure_line(failed.failures, held, lost_at, raised), file=sys.stderr)
        return 1
    except DistNetworkError as error:  # its rendezvous could not start (a port in use)
        _finish(reports)
        print(_rendezvous_line(error), file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a Ctrl-C before torchrun set its handlers (rendezvous)
        return _stopped_early(reports)
    except Stopped as stopped:
        return _stopped_early(reports, stopped.signum)
    except SignalException as stopped:
        _finish(reports)
        number = int(stopped.sigval)
        if not stop_reported_by_owner():  # else the command that started it says so
            print(
                f"torchrun: stopped by {signal.Signals(number).name}; its worker processes "
                "were stopped first",
                file=sys.stderr,
            )
        return 128 + number
    finally:
        if reports and not reports.finished:
            _finish(reports)
        if log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def _with_log_dir(argv: list[str]) -> tuple[list[str], str | None]:
    """torchrun's arguments with `--log-dir` set to a new temporary directory of the
    launcher's, and that directory; the arguments as they are (and None) where they or
    the environment name a log directory already, or where none can be made."""
    named = any(arg.split("=", 1)[0] in ("--log-dir", "--log_dir") for arg in _options(argv))
    if named or os.environ.get("PET_LOG_DIR"):
        return argv, None
    try:
        log_dir = tempfile.mkdtemp(prefix="metadist-torchrun-")
    except OSError:  # torchrun's own choice then (it says what is wrong, if anything)
        return argv, None
    return [f"--log-dir={log_dir}", *argv], log_dir


def _options(argv: list[str]) -> list[str]:
    """torchrun's own arguments: those before the training script or module (the first
    argument that is not an option, or `-m`'s module)."""
    for index, arg in enumerate(argv):
        if arg in ("-m", "--module"):
            return argv[:index]
        if not arg.startswith("-"):
            return argv[:index]
    return argv


def _stopped_early(reports: RankReports | None, signum: int = signal.SIGINT) -> int:
    """Ctrl-C (or `signum`: SIGTERM, SIGHUP) before any worker started (torch imported,
    rendezvous): one line, 128 + the signal's number."""
    _finish(reports)
    if not stop_reported_by_owner():  # else the command that started it says so
        name = signal.Signals(signum).name
        print(f"torchrun: stopped by {name} before its worker processes started", file=sys.stderr)
    return 128 + signum


def _rendezvous_line(error: Exception) -> str:
    """The one line of a rendezvous that could not start: torchrun's reason, and where
    its store's port is taken by another process, how to choose another."""
    reason = short(last_line([str(error).strip().encode()]) or type(error).__name__)
    line = f"torchrun: error: the rendezvous could not start: {reason}"
    if "EADDRINUSE" in reason:
        line += (
            "; another process listens on that port: pass a free one (--master_port, "
            "--rdzv-endpoint HOST:PORT), or --standalone to have one chosen"
        )
    return line


class _StopNotices(logging.Filter):
    """Drops torchrun's warnings that it received a stop signal and is passing it on to
    each worker, and its error log of a failed worker: the one line printed on a stop or
    a failure says them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_STOP_NOTICES)


def _quiet_stop_notices() -> None:
    """Puts `_StopNotices` on the two torchrun loggers that warn of a stop."""
    for name in _STOP_LOGGERS:
        logging.getLogger(name).addFilter(_StopNotices())


def _finish(reports: RankReports | None) -> None:
    """Ends the filtering; lost-peer reports still held are collapsed into one line."""
    held = reports.finish() if reports else {}
    if held:
        print(collapsed(held), file=sys.stderr)


def _failure_line(
    failures: dict[int, Any],
    held: dict[int, list[bytes]],
    lost_at: dict[int, float],
    raised: set[int] = frozenset(),  # type: ignore[assignment]
) -> str:
    """The one line of a run whose training processes failed: the rank that failed
    first and, briefly, the ranks that failed on losing it (`held`: their reports).

    The first failure is, in this order: a rank that reported an error of its own
    (`raised`: its traceback; torchrun may have sent it SIGTERM while it was exiting,
    once a peer that lost it had failed), a rank killed by a signal other than SIGTERM
    (which torchrun stops the others with), a rank that failed otherwise, a rank
    stopped by SIGTERM, a rank that had just lost a peer (`lost_at`); the earliest, then
    the lowest rank among equals. torchrun's own choice (the earliest) often names a
    survivor: failures are timed to the second. Where the first failure is a rank that
    lost a peer (the rank it lost ran on another machine), its report is shown in full.
    """

    def order(rank: int) -> tuple[int, int, int]:
        failure = failures[rank]
        if rank in raised:
            kind = -1
        elif failure.timestamp - lost_at.get(rank, -1e18) <= _LOST_PEER_WINDOW_S:
            kind = 3
        elif failure.exitcode == -signal.SIGTERM:
            kind = 2
        else:
            kind = 0 if failure.exitcode < 0 else 1
        return kind, failure.timestamp, rank

    rank = min(failures, key=order)
    failure = failures[rank]
    if rank in held:
        sys.stderr.flush()
        write_all(2, b"".join(held.pop(rank)))
    unsaid = unsaid_line(failures, rank)  # an error that rank met alone, said by no one
    if unsaid is not None:
        print(unsaid, file=sys.stderr)
    if failure.exitcode < 0 and rank in raised:  # stopped as it exited on its error
        line = f"torchrun: the process of rank {rank} failed (its own message is above); "
        line += "the others were stopped"
    elif failure.exitcode < 0:
        line = f"torchrun: the process of rank {rank} was killed by "
        line += f"{failure.signal_name()}; the others were stopped"
    else:
        line = f"torchrun: the process of rank {rank} exited with status "
        line += f"{failure.exitcode} (its own message is above); the others were stopped"
    if held:
        ranks = sorted(held)
        who = f"rank {ranks[0]} had" if len(ranks) == 1 else f"ranks {ranks} had"
        line += f" ({who} lost it: {short(last_line(held[ranks[0]]))}; traceback left out)"
    return line


if __name__ == "__main__":
    sys.exit(main())
