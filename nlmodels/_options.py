"""Checks of model constructor options shared by the built-in models, each naming the option."""

from __future__ import annotations

__all__ = ["require_positive_integers"]


def require_positive_integers(**options: object) -> None:
    """``ValueError`` naming the first option that is not an integer >= 1 (bools refused)."""
    for name, value in options.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not float(value).is_integer()
            or value < 1
        ):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
