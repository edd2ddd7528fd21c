"""What a study measured of a trained model besides its test RMSE, as a ledger record keeps it
(:class:`Measured`): numbers, ``measures`` (the CMI of Table:CMI), and short named series,
``curves`` (the training loss per epoch of figure ILTcompar, the NFEs of figure nfes_analysis),
with the checks a record's reader applies to them. Only the standard library loads here.

A curve is a field of the record of its own (``LedgerRecord.curves``) rather than a list among
the ``measures``: a measure is a number that tables average over seeds and every reader takes as
a float, while a curve is drawn as it is; kept apart, no reader of numbers ever meets a list, a
cell's mark (``LedgerCell.measure``) may be either, and a line without curves (every line written
before there were any) reads, and is written back, exactly as it was. A curve keeps at most
:data:`MAX_CURVE_POINTS` points (:func:`downsample`), so that a ledger line stays a short line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

__all__ = ["MAX_CURVE_POINTS", "Curve", "Measured", "checked_curves", "downsample", "finite"]

#: The most points a record's curve keeps (:func:`downsample`): enough to draw a figure's line,
#: few enough that a ledger line stays a line (a 1000-epoch loss history is cut to a tenth).
MAX_CURVE_POINTS = 100

#: A short named series of a record: ``(x, y)`` points, ``x`` increasing (an epoch, a time, a
#: horizon), ``y`` its value; at most :data:`MAX_CURVE_POINTS`.
Curve = tuple[tuple[float, float], ...]


def downsample(points: Sequence[tuple[float, float]], most: int = MAX_CURVE_POINTS) -> Curve:
    """``points`` cut to ``most`` of them, evenly spaced by index, the first and the last kept
    (the shape of a loss history: its start, its end and its course between), each value to 7
    significant digits (a curve is drawn, not computed with: a shorter line)."""
    n = len(points)
    if n > most:
        step = (n - 1) / (most - 1)
        points = [points[round(i * step)] for i in range(most)]
    return tuple((_short(x), _short(y)) for x, y in points)


def _short(v: float) -> float:
    return float(f"{float(v):.7g}")


@dataclass(frozen=True)
class Measured:
    """What a study measured of one trained model besides its test RMSE: ``measures``, numbers a
    table aggregates over seeds (the CMI in bits), and ``curves``, series a figure draws (the
    training loss per epoch); a record keeps both (:attr:`LedgerRecord.measures`,
    :attr:`LedgerRecord.curves`)."""

    measures: Mapping[str, float] = field(default_factory=dict)
    curves: Mapping[str, Curve] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        """Whether ``name`` was measured, as a number or as a curve (the mark a study's cell
        needs of a record: :attr:`LedgerCell.measure`)."""
        return name in self.measures or name in self.curves


def finite(v: Any) -> bool:
    """Whether ``v`` is a finite JSON number (not a bool)."""
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def checked_curves(curves: Any) -> dict[str, Curve]:
    """A record's ``curves`` checked (names to at most :data:`MAX_CURVE_POINTS` ``[x, y]``
    pairs of finite numbers, ``x`` increasing) and made tuples; raises ``ValueError``."""
    if not isinstance(curves, Mapping):
        raise ValueError(f"curves must map names to lists of [x, y] points, got {curves!r}")
    out = {}
    for name, points in curves.items():
        if not isinstance(name, str) or not name or not isinstance(points, list | tuple):
            raise ValueError(f"curves must map names to lists of [x, y] points, got {name!r}")
        if not 0 < len(points) <= MAX_CURVE_POINTS:
            raise ValueError(
                f"curve {name!r} has {len(points)} points (1 to {MAX_CURVE_POINTS} are kept)"
            )
        pairs = []
        for p in points:
            if not isinstance(p, list | tuple) or len(p) != 2 or not all(map(finite, p)):
                raise ValueError(f"curve {name!r}: a point is [x, y] of finite numbers, got {p!r}")
            pairs.append((float(p[0]), float(p[1])))
        if any(b[0] <= a[0] for a, b in pairwise(pairs)):
            raise ValueError(f"curve {name!r}: its x must increase")
        out[name] = tuple(pairs)
    return out
