"""The platform's error families, matched by type (``isinstance``) wherever an error is
classified: the command line's exit codes, the run log's run endings, the fault lines.

Standard library only: the command line imports it before anything heavy loads.
"""

from __future__ import annotations

__all__ = ["Interrupted", "SettingError", "Unreachable"]


class SettingError(RuntimeError):
    """A setting to change (a Dask or tuning option that cannot work): exit code 2."""


class Unreachable(RuntimeError):
    """A store, a study storage or a scheduler the platform cannot reach or use: one line
    naming it, exit code 3."""


class Interrupted(RuntimeError):
    """Work stopped on request (a stop event, a signal): its run ends KILLED, not FAILED."""
