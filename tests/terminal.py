"""A child process as a terminal's job: what the tests that press Ctrl-C give it."""

from __future__ import annotations

import signal


def takes_ctrl_c() -> None:
    """A child's ``preexec_fn``: SIGINT back to its default action, as a terminal's foreground
    job has it. A shell's ``&`` job ignores SIGINT and its children inherit that, so a suite run
    in the background would otherwise send Ctrl-C to a command that never sees it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
