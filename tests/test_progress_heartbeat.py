"""A run that is still simulating its data sets (a slow or hanging simulator) says so, in a
terminal as well as redirected; once training starts a terminal's bar takes over."""

from __future__ import annotations

import sys
import time

import pytest

from tasks import progress


@pytest.mark.parametrize("terminal", [True, False])
def test_a_silent_simulation_is_said_in_a_terminal_and_redirected(monkeypatch, capsys, terminal):
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.05)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    with progress.Display(True, todo=2, reused=0) as display:
        # until the heartbeat speaks (a silence of HEARTBEAT_SECONDS; a loaded machine may
        # hold its thread back for long, so no fixed sleep), a minute at most
        said, deadline = "", time.monotonic() + 60
        while "… simulating data sets" not in said and time.monotonic() < deadline:
            time.sleep(0.05)
            said += capsys.readouterr().out
        assert "… simulating data sets" in said
        display.training_started()
        alive = display.heartbeat._thread.is_alive()
    assert alive is not terminal  # a terminal's bar shows the training; redirected, it beats


def test_no_progress_no_heartbeat(monkeypatch, capsys):
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.05)
    with progress.Display(False, todo=1, reused=0):
        time.sleep(0.3)
    assert capsys.readouterr().out == ""
