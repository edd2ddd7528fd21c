"""The one verdict against the paper (:func:`tasks.reports.verdict.verdict`): its t distribution,
each of its four cases on hand-computed figures, and the views that state its rule."""

from __future__ import annotations

import math

import pytest

from tasks.reports.verdict import VERDICT_RULE, t_test_p_value, verdict


def sample_std(population_std: float, n: int) -> float:
    """The sample std (ddof 1, what :func:`verdict` takes) of ``n`` values of that spread."""
    return population_std * math.sqrt(n / (n - 1))


@pytest.mark.parametrize("df", [0.7, 1.0, 2.0, 3.4, 4.0, 8.0, 30.0, 500.0])
@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.0, 2.776, 4.5, 12.0])
def test_p_value_is_students_t(t, df):
    from scipy import stats

    assert t_test_p_value(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-10, abs=1e-14)


def test_welch_on_the_ledgers_own_cells():
    # node, stiff Van der Pol: 0.4419 ± 0.2505 over 3 seeds (population std) against
    # 0.2833 ± 0.0032: our sample std 0.2505·√(3/2) = 0.3068, t = 0.1586 / 0.1771 = 0.90 with
    # 2.0 degrees of freedom, p = 0.46: no difference found, but 0.16 apart, far beyond the
    # paper's ± 0.0032: unclear, not a match
    assert verdict(0.4419, sample_std(0.2505, 3), 3, 0.2833, 0.0032) == "unclear"
    # Neural Laplace, Mackey–Glass: 0.02869 ± 0.02202 (5) against 0.0282 ± 0.0246: a match
    assert verdict(0.02869, sample_std(0.02202, 5), 5, 0.0282, 0.0246) == "match"
    # node, spiral: 0.03148 ± 0.001413 (3 seeds) against 0.0389 ± 0.0029: t = −4.5, p < 0.01
    assert verdict(0.03148, sample_std(0.001413, 3), 3, 0.0389, 0.0029) == "better"
    # the same means, the spreads swapped onto the other side: worse is symmetric
    assert verdict(0.0389 + 0.0074, sample_std(0.001413, 3), 3, 0.0389, 0.0029) == "worse"


def test_welch_by_hand_at_the_threshold():
    # Two samples of 5 with equal sample std 1: se = √(2/5), df = 8; the 5 % two-sided
    # critical t is 2.306; the paper's ± is 1.
    std, se = 1.0, math.sqrt(2 / 5)
    assert verdict(0.9, std, 5, 0.0, 1.0) == "match"  # t = 1.42, within ± 1
    assert verdict(2.30 * se, std, 5, 0.0, 1.0) == "unclear"  # 1.455 away: beyond ± 1
    assert verdict(-2.32 * se, std, 5, 0.0, 1.0) == "better"


def test_one_seed_is_one_more_draw_of_the_papers():
    # se = 0.01·√(1 + 1/5) = 0.010954, 4 degrees of freedom: critical t 2.776
    se = 0.01 * math.sqrt(1.2)
    assert verdict(0.5 + 0.009, None, 1, 0.5, 0.01) == "match"
    assert verdict(0.5 + 2.7 * se, None, 1, 0.5, 0.01) == "unclear"
    assert verdict(0.5 + 2.9 * se, float("nan"), 1, 0.5, 0.01) == "worse"


def test_seeds_against_a_figure_without_spread():
    # Table 5 style: a single figure. Three seeds 0.06, 0.07, 0.08 (population std √(2/3)·0.01,
    # sample std 0.01, se 0.01/√3): against 0.0650, t = 0.87, within 10 %: a match; against
    # 0.0614, t = 1.50, 14 % off: unclear; against 0.03, t = 6.9: worse (the paper's std
    # unknown or NaN alike).
    std = 0.01
    assert verdict(0.07, std, 3, 0.0650) == "match"
    assert verdict(0.07, std, 3, 0.0614) == "unclear"
    assert verdict(0.07, std, 3, 0.03, float("nan")) == "worse"


def test_no_spread_anywhere_is_ten_percent_and_direction_follows_the_metric():
    assert verdict(0.0180, None, 1, 0.0171) == "match"  # 5 % off
    assert verdict(0.0190, None, 1, 0.0171) == "worse"  # 11 % off
    assert verdict(3.0, 0.0, 3, 3.6, 0.0) == "better"  # zero spread on both sides: 17 % off
    # higher is better (CMI): above the figure is better
    assert verdict(3.0, None, 1, 2.0, higher_is_better=True) == "better"
    assert verdict(float("nan"), 0.1, 3, 0.2, 0.1) == "" == verdict(0.1, 0.1, 3, float("nan"))
    assert verdict(0.1, 0.1, 0, 0.2, 0.1) == ""


def test_the_results_table_states_the_one_rule():
    # (the HTML report's legend: tests/test_report_full.py; the ledger's views: test_ledger.py)
    from tasks.reports.reporting import results_table
    from tasks.results import CellResult

    table = results_table([CellResult("integro_de", "node", 0, "finished", 0.07)], profile="paper")
    assert VERDICT_RULE in table.main_table().caption
