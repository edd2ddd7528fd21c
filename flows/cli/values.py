"""The argparse value types the commands share (a name list, bounded whole numbers, seconds):
the standard library only."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

__all__ = [
    "budget_seconds",
    "names",
    "niceness",
    "port",
    "positive_int",
    "positive_number",
    "whole_number",
]


def names(text: str) -> str:
    """An argparse type: a name, or names separated by commas (an empty one names nothing)."""
    if not any(text.split(",")):
        raise argparse.ArgumentTypeError(
            f"expected a name or names separated by commas, got {text!r}"
        )
    return text


def whole_number(low: int, high: int | None, what: str) -> Callable[[str], int]:
    """An ``argparse`` type: an integer from ``low`` to ``high`` (None: unbounded), else a
    usage error saying it must be ``what`` (``--trials 0``, ``--port 99999``, ``--nice -1``)."""

    def parse(text: str) -> int:
        value = int(text) if re.fullmatch(r"\s*[+-]?\d+\s*", text) else low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
        return value

    return parse


positive_int = whole_number(1, None, "a whole number of at least 1")
port = whole_number(1, 65535, "a TCP port from 1 to 65535")
niceness = whole_number(0, 19, "a niceness from 0 to 19")  # <0 needs privileges; Linux caps at 19


def positive_number(unit: str, most: float, *, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a number of ``unit`` above 0 (``zero``: 0 or more) and at most
    ``most``, else a usage error naming the unit (``--max-hours -1``, ``--max-minutes nan``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (0 <= value if zero else 0 < value) or not value <= most:  # NaN fails too
            least = "0 or more" if zero else "above 0"
            raise argparse.ArgumentTypeError(f"a number of {unit} {least}, got {text!r}")
        return value

    return parse


def budget_seconds(text: str) -> float | str:
    """An argparse type: seconds above 0, or ``none`` (no time limit)."""
    if text.strip().lower() == "none":
        return "none"
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds < math.inf):  # said here, not as the setting it sets (max_train_seconds)
        raise argparse.ArgumentTypeError(f"a number of seconds above 0 or 'none', got {text!r}")
    return seconds
