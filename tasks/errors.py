"""The platform's error families, matched by type (``isinstance``) wherever an error is
classified: the command line's exit codes, the run log's run endings, the fault lines.

Standard library only (and :mod:`nltrain`'s errors, as light): the command line imports it
before anything heavy loads. :class:`Interrupted` is the training floor's, the base of
``nltrain.TrainingInterrupted``.
"""

from __future__ import annotations

from nltrain import Interrupted

__all__ = ["Interrupted", "SettingError", "Unreachable"]


class SettingError(RuntimeError):
    """A setting to change (a Dask or tuning option that cannot work): exit code 2."""


class Unreachable(RuntimeError):
    """A store, a study storage or a scheduler the platform cannot reach or use: one line
    naming it, exit code 3."""
