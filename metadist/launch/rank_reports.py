"""The training processes' stderr under torchrun, with the tracebacks of ranks that
only lost a peer collapsed into one line.

When one rank dies (killed, or failing), the others fail in their next collective
(gloo: "Connection reset by peer") and print a traceback each before torchrun stops
them: that traceback says nothing about the failure, and buries the line that does.
torch prefixes every line of a rank's uncaught exception with `[rankN]: `, so such a
report can be told apart from the rest of the output as it passes through a pipe.
`RankReports` puts that pipe on fd 2 (the workers inherit it) and reads it in a thread:
everything passes on at once, except reports, each held until complete; a report whose
exception is a lost peer is held further (`hold_s`) so that the launcher can fold it
into its line on the failure, or else collapsed into one line of its own (a restart).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading
import time

# the prefix torch's excepthook puts on each line of a rank's uncaught exception
_PREFIX = re.compile(rb"\[rank(\d+)\]: ")
# the start of a line that may still become that prefix
_PREFIX_START = re.compile(rb"\[(r(a(n(k(\d+(\](:)?)?)?)?)?)?)?")
# what a rank's exception says when a peer it communicates with went away
_LOST_PEER = re.compile(
    r"Connection (reset|closed|refused)|Broken pipe|Dist(Network|Backend|Store)Error|gloo|"
    r"NCCL|timed out|Timeout",
)


class RankReports:
    """The ranks' stderr, through a pipe read by a thread (see the module's doc).

    Attributes:
        held: the lost-peer reports not yet shown, `{rank: lines}`.
        lost_at: when each rank last reported a lost peer (`time.time()`).
        raised: the ranks that reported an error of their own (a traceback, not a
            lost peer's): such a rank failed, whatever signal torchrun then sent it.
        finished: `finish` was called.
    """

    def __init__(self, original: int, read: int, idle_s: float, hold_s: float) -> None:
        self.original = original  # the launcher's real stderr
        self.read = read
        self.idle_s, self.hold_s = idle_s, hold_s
        self.carry = b""  # the start of a line, not yet known to be held or passed
        self.passing = False  # the rest of the current line passes on
        self.reports: dict[int, list[bytes]] = {}  # the reports being read, by rank
        self.report_at: dict[int, float] = {}  # when each got its last line
        self.last_rank: int | None = None  # the rank of the last line, if a report's
        self.held: dict[int, list[bytes]] = {}
        self.held_since = 0.0
        self.lost_at: dict[int, float] = {}
        self.raised: set[int] = set()
        self.finished = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, idle_s: float = 0.5, hold_s: float = 3.0) -> RankReports | None:
        """Puts the pipe on fd 2; None where fd 2 cannot be duplicated (closed): then
        nothing is filtered."""
        try:
            original = os.dup(2)
        except OSError:
            return None
        read, write = os.pipe()
        sys.stderr.flush()
        os.dup2(write, 2)
        os.close(write)
        return cls(original, read, idle_s, hold_s)

    def finish(self, timeout_s: float = 5.0) -> dict[int, list[bytes]]:
        """Puts the real stderr back on fd 2, reads what the ranks wrote until they all
        closed the pipe (at most `timeout_s`: a leftover child may hold it; what it
        writes later passes on at once), and returns the lost-peer reports still held."""
        sys.stderr.flush()
        os.dup2(self.original, 2)
        self.thread.join(timeout_s)
        with self.lock:
            self.finished = True
            if self.carry:
                self._line(self.carry)
                self.carry = b""
            for rank in list(self.reports):
                self._end_report(rank)
            held, self.held = self.held, {}
        if not self.thread.is_alive():
            os.close(self.original)
        return held

    def _pump(self) -> None:
        while True:
            ready, _, _ = select.select([self.read], [], [], min(self.idle_s, 0.25))
            data = b""
            if ready:
                with contextlib.suppress(OSError):
                    data = os.read(self.read, 65536)
                if not data:
                    os.close(self.read)
                    return
            with self.lock:
                if self.finished:
                    write_all(self.original, data)
                    continue
                self._feed(data)
                self._tick(time.monotonic())

    def _tick(self, now: float) -> None:
        """Ends the reports idle for `idle_s`; collapses reports held for `hold_s`."""
        for rank, since in list(self.report_at.items()):
            if not self.carry and now - since > self.idle_s:
                self._end_report(rank)
        if self.held and now - self.held_since > self.hold_s:
            write_all(self.original, (collapsed(self.held) + "\n").encode())
            self.held = {}

    def _feed(self, data: bytes) -> None:
        if self.passing and _PREFIX.match(data):
            # another process's report after a line left open (a progress bar's \r):
            # a new line, as each process's write comes in one piece
            self.passing = False
        while data:
            cut = data.find(b"\n") + 1
            if self.passing:
                if not cut:
                    write_all(self.original, data)
                    return
                write_all(self.original, data[:cut])
                data, self.passing = data[cut:], False
            elif not cut:
                self.carry += data
                if not (_PREFIX.match(self.carry) or _PREFIX_START.fullmatch(self.carry)):
                    write_all(self.original, self.carry)
                    self.carry, self.passing = b"", True
                return
            else:
                self._line(self.carry + data[:cut])
                self.carry, data = b"", data[cut:]

    def _line(self, line: bytes) -> None:
        """A line: part of its rank's report (a blank line: of the report of the line
        before it, if any), else passed on. Ranks write at once, so their reports may
        interleave; each is complete once idle."""
        match = _PREFIX.match(line)
        if match is not None:
            self.last_rank = rank = int(match[1])
        elif not line.strip() and self.last_rank in self.reports:
            rank = self.last_rank
        else:
            self.last_rank = None
            write_all(self.original, line)
            return
        self.reports.setdefault(rank, []).append(line)
        self.report_at[rank] = time.monotonic()

    def _end_report(self, rank: int) -> None:
        """`rank`'s report is complete: held if it is a lost peer, else shown."""
        lines = self.reports.pop(rank)
        del self.report_at[rank]
        if not _LOST_PEER.search(last_line(lines)):
            if any(b"Traceback (most recent call last)" in line for line in lines):
                self.raised.add(rank)
            write_all(self.original, b"".join(lines))
            return
        if not self.held:
            self.held_since = time.monotonic()
        self.held[rank] = self.held.get(rank, []) + lines
        self.lost_at[rank] = time.time()


def collapsed(held: dict[int, list[bytes]]) -> str:
    """One line for the lost-peer reports `held`: the ranks, the first one's exception."""
    ranks = sorted(held)
    who = (
        f"the process of rank {ranks[0]}"
        if len(ranks) == 1
        else f"the processes of ranks {', '.join(map(str, ranks))}"
    )
    return f"torchrun: {who} lost a peer: {short(last_line(held[ranks[0]]))} (traceback left out)"


def last_line(lines: list[bytes]) -> str:
    """The last non-blank line of a report (its exception), without the prefix."""
    for line in reversed(lines):
        text = _PREFIX.sub(b"", line, count=1).decode(errors="replace").strip()
        if text:
            return text
    return ""


def short(text: str, width: int = 160) -> str:
    """An exception line without gloo's source location and advice, at most `width`."""
    text = re.sub(r"\[[^\]\s]*:\d+\] ", "", text)
    text = text.split(" This is typically caused", 1)[0].rstrip(".")
    return text if len(text) <= width else text[: width - 3] + "..."


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
