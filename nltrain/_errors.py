"""How training ends other than by its stopping rules: a request to stop, or a divergence.

Standard library only: :class:`Interrupted` is the base of the platform's "stopped on request"
family (``tasks.errors`` re-exports it), which the command line imports before anything heavy.
"""

from __future__ import annotations

__all__ = ["Interrupted", "TrainingDiverged", "TrainingInterrupted"]


class Interrupted(RuntimeError):
    """Work stopped on request (a stop event, a signal): its run ends KILLED, not FAILED."""


class TrainingDiverged(RuntimeError):
    """The loss or the gradients became NaN or infinite."""


class TrainingInterrupted(Interrupted):
    """Training was asked to stop (Ctrl-C or a cancelled flow) before it finished."""
