"""The time-left estimate of a progress line, on a fake clock: no figure before real
progress, and the rate measured after the first (warm-up) unit."""

from __future__ import annotations

import io

from metadist.progress import Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _display(clock: FakeClock, stream: io.StringIO) -> Progress:
    return Progress(enabled=True, every=1e9, stream=stream, clock=clock)


def test_no_estimate_before_any_progress():
    clock, stream = FakeClock(), io.StringIO()
    with _display(clock, stream) as display:
        counter = display.counter("evaluating", 518, "tasks")
        clock.now += 17
        counter.update(0)
        assert counter.seconds_left(clock.now) is None
        line = counter.line(17)
    assert line == "evaluating: 0/518 tasks (0%), 17 s, estimating time left"


def test_a_slow_first_step_is_not_the_rate():
    # a compile: the first step takes 88 s, the others 1 s each
    clock, stream = FakeClock(), io.StringIO()
    with _display(clock, stream) as display:
        counter = display.counter("meta-training", 20, "steps")
        clock.now += 88
        counter.update(1)
        assert counter.seconds_left(clock.now) is None  # one unit: nothing measured yet
        assert "estimating time left" in counter.line(88)
        clock.now += 1
        counter.update(2)
        assert counter.seconds_left(clock.now) == 18.0
        assert counter.line(89) == "meta-training: 2/20 steps (10%), 89 s, about 18 s left"
        clock.now += 4
        counter.update(6)
        assert counter.seconds_left(clock.now) == 14.0


def test_chunks_and_a_resumed_start():
    clock, stream = FakeClock(), io.StringIO()
    with _display(clock, stream) as display:
        counter = display.counter("evaluating", 500, "tasks", start=100)
        clock.now += 30
        counter.update(164)  # the first chunk, warm-up included
        clock.now += 2
        counter.update(228)  # 64 tasks in 2 s: 272 left take 8.5 s
        assert counter.seconds_left(clock.now) == 8.5
        clock.now += 100
        counter.update(500)
        assert counter.seconds_left(clock.now) == 0.0


def test_lines_off_a_terminal_use_the_clock():
    clock, stream = FakeClock(), io.StringIO()
    with Progress(enabled=None, every=10, stream=stream, clock=clock) as display:
        counter = display.counter("pretrained embedding", 40, "steps")
        clock.now += 11
        counter.update(0)
        clock.now += 11
        counter.update(4)
        clock.now += 11
        counter.update(8)  # 4 steps in 11 s since the first progress: 32 left take 88 s
    printed = stream.getvalue().splitlines()
    assert printed == [
        "pretrained embedding: 0/40 steps (0%), 11 s, estimating time left",
        "pretrained embedding: 4/40 steps (10%), 22 s, estimating time left",
        "pretrained embedding: 8/40 steps (20%), 33 s, about 88 s left",
    ]


def test_the_terminal_bar_shows_the_same_estimate():
    clock, stream = FakeClock(), io.StringIO()
    with Progress(enabled=True, lines=False, stream=stream, clock=clock) as display:
        counter = display.counter("meta-training", 20, "steps")
        clock.now += 90
        counter.update(1)
        fields = display._rich.tasks[0].fields
        assert fields["left"] == ""
        clock.now += 1
        counter.update(2)
        assert fields["left"] == "~18 s left"


def test_work_done_at_its_first_progress_has_nothing_left():
    # a competition's trainings report their steps when they end: 0/20, then 20/20 at once
    clock, stream = FakeClock(), io.StringIO()
    with _display(clock, stream) as display:
        counter = display.counter("meta-training", 20, "meta-steps")
        clock.now += 46
        counter.update(20)
        assert counter.seconds_left(clock.now) == 0.0
        line = counter.line(46)
    assert line == "meta-training: 20/20 meta-steps (100%), 46 s, about 0 s left"
