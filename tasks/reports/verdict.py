"""The one verdict of our result against a published figure: better, match or worse.

Every view that marks ours against the paper (▲ ✓ ▼) calls :func:`verdict`: the results table
of a benchmark, ``nllab ledger status`` and ``table`` (and the README's generated block), the
HTML report and the study tables. :data:`VERDICT_RULE` says the rule in one sentence, for
captions, legends and the README. Standard library only: the ledger's views answer without
numpy or scipy.

Why a test and not overlapping bands: with 3–5 seeds a ± band is mostly noise of its own (one
wild seed widens ours until it "matches" anything), while Welch's t-test weighs each side's
spread by its number of seeds and does not assume equal variances (B. L. Welch, "The
generalization of 'Student's' problem when several different population variances are
involved", Biometrika 34, 1947; the degrees of freedom by Satterthwaite, Biometrics Bulletin 2,
1946): the test a reviewer expects for two small samples summarised as mean ± std. A test that
finds no difference is not evidence of agreement, though (with few, spread seeds it finds none
for anything), so ✓ also asks our mean to lie within the paper's own seed spread, the
practical margin of an equivalence judgement (cf. Schuirmann's two one-sided tests, J.
Pharmacokinet. Biopharm. 15, 1987); the rest is marked ? rather than claimed.
"""

from __future__ import annotations

import math
from typing import Literal, TypeGuard, get_args

__all__ = [
    "ALPHA",
    "PAPER_SEEDS",
    "RELATIVE_TOLERANCE",
    "VERDICT_RULE",
    "Verdict",
    "is_verdict",
    "t_test_p_value",
    "verdict",
]

Verdict = Literal["better", "match", "worse", "unclear", ""]


def is_verdict(value: object) -> TypeGuard[Verdict]:
    """Whether ``value`` is a :data:`Verdict` (``""``, none, included)."""
    return value in get_args(Verdict)


#: Seeds behind each of the paper's mean ± std figures (Table 3: five seeds).
PAPER_SEEDS = 5
#: Significance level of the two-sided test.
ALPHA = 0.05
#: Where neither side has a spread to test with: a match within this share of the paper's figure.
RELATIVE_TOLERANCE = 0.10

#: The rule in one sentence (captions, legends, the README).
VERDICT_RULE = (
    "▲ better or ▼ worse than the paper where Welch's t-test of our mean over seeds against "
    "the paper's (5 seeds) finds a difference at the 5 % level; where it finds none, ✓ if our "
    "mean lies within the paper's ± std (within 10 % of a figure without ±), ? if not (too few "
    "or too spread seeds to tell)"
)


def verdict(
    mean: float,
    std: float | None,
    n: int,
    paper: float,
    paper_std: float | None = None,
    *,
    paper_n: int = PAPER_SEEDS,
    higher_is_better: bool = False,
) -> Verdict:
    """Ours (``mean`` and sample ``std``, ddof 1, over ``n`` seeds) against the paper's
    ``paper`` ± ``paper_std`` (taken as the sample std over ``paper_n`` seeds).

    * both spreads known: Welch's t-test, Welch–Satterthwaite degrees of freedom;
    * the paper's figure has no ± (a single figure): a one-sample t-test of our seeds against it
      (``n − 1`` degrees of freedom);
    * one seed of ours against mean ± std: our seed as one more draw from the paper's seeds
      (the prediction interval, variance ``paper_std² (1 + 1/paper_n)``, ``paper_n − 1`` degrees
      of freedom);
    * no spread on either side (or both zero): no test; a difference beyond
      :data:`RELATIVE_TOLERANCE` of ``paper`` counts as found.

    ``better``/``worse`` (by the sign; lower is better unless ``higher_is_better``) when the
    two-sided p-value is below :data:`ALPHA`. Otherwise the test found no difference, which
    with 3–5 seeds is not yet agreement: ``match`` when our mean also lies within the paper's
    ± std (within :data:`RELATIVE_TOLERANCE` of a figure without ±), else ``unclear`` (too
    few or too spread seeds to tell). ``""`` without both figures.
    """
    if not (_finite(mean) and _finite(paper)) or n < 1:
        return ""
    ours = std**2 if n >= 2 and _finite(std) else None
    theirs = paper_std**2 if paper_n >= 2 and _finite(paper_std) else None
    if ours is not None and theirs is not None:
        a, b = ours / n, theirs / paper_n
        se2 = a + b
        df = se2**2 / (a**2 / (n - 1) + b**2 / (paper_n - 1)) if se2 > 0 else 0.0
    elif ours is not None:
        se2, df = ours / n, float(n - 1)
    elif theirs is not None:
        se2, df = theirs * (1 + 1 / paper_n), float(paper_n - 1)
    else:
        se2, df = 0.0, 0.0
    diff = mean - paper
    band = paper_std if _finite(paper_std) and paper_std > 0 else RELATIVE_TOLERANCE * abs(paper)
    if se2 > 0:
        differs = t_test_p_value(diff / math.sqrt(se2), df) < ALPHA
    else:
        differs = abs(diff) > RELATIVE_TOLERANCE * abs(paper)
    if differs:
        return "better" if (diff > 0) == higher_is_better else "worse"
    return "match" if abs(diff) <= band else "unclear"


def _finite(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x)


def t_test_p_value(t: float, df: float) -> float:
    """The two-sided p-value of Student's t with ``df`` (> 0, not necessarily whole) degrees of
    freedom: ``I_{df/(df+t²)}(df/2, 1/2)``, the regularized incomplete beta function
    (Abramowitz & Stegun 26.7.1 with 26.5.27)."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2, 0.5, df / (df + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` by its continued fraction
    (Abramowitz & Stegun 26.5.8, evaluated by the modified Lentz method as in Press et al.,
    Numerical Recipes, 3rd ed., §6.4), on the side of ``x`` where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    return math.exp(log_front) * _continued_fraction(a, b, x) / a


def _continued_fraction(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h
