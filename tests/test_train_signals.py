"""`train.signals.StopRequest`: the first stop signal asks for a checkpoint; a second
Ctrl-C aborts, but not the same Ctrl-C delivered twice."""

from __future__ import annotations

import os
import signal
import time

import pytest

from metadist.train import signals
from metadist.train.signals import StopRequest


@pytest.fixture(autouse=True)
def _sigint_handled():
    """SIGINT at its Python default (it is ignored where the tests run in the background)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_the_same_ctrl_c_delivered_twice_stops_once_with_a_checkpoint():
    """A terminal's Ctrl-C reaches the training while its parent command (or GNU
    `timeout`) passes it on too: two SIGINTs at once ask for one stop, not an abort."""
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    assert stop.signal_name == "SIGINT"


def test_the_first_ctrl_c_says_what_happens_and_how_to_abort(capsys, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with StopRequest():
        os.kill(os.getpid(), signal.SIGINT)
    assert capsys.readouterr().err == (
        "SIGINT: stopping after this meta-step, with a checkpoint (Ctrl-C again after 1 s "
        "aborts at once, without one)\n"
    )
    monkeypatch.setenv("LOCAL_RANK", "0")  # a rank: its launcher speaks for it
    with StopRequest():
        os.kill(os.getpid(), signal.SIGINT)
    assert capsys.readouterr().err == ""


def test_a_second_ctrl_c_later_aborts_at_once(monkeypatch):
    monkeypatch.setattr(signals, "REPEAT_S", 0.05)
    with pytest.raises(KeyboardInterrupt), StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
    assert stop.signal_name == "SIGINT"
