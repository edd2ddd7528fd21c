"""The fidelity page's finding before every seed is in: each system ranked on the seeds every
method has recorded (the same data sets for every method), beside the means over unequal seeds."""

from __future__ import annotations

from test_ledger_peers import _at, _scope

from flows.ledger.text import interim_ranking
from tasks.ledger import best_per_system, ledger_status


def _status(values: dict[tuple[str, str], dict[int, float]]):
    scope = _scope(seeds=(0, 1, 2))
    records = [
        _at(scope, system, method, seed, test_rmse=rmse)
        for (system, method), by_seed in values.items()
        for seed, rmse in by_seed.items()
    ]
    return ledger_status(records, scope.select(ablations=False))


def test_a_system_is_ranked_on_the_seeds_every_method_shares():
    status = _status(
        {
            # by its mean over unequal seeds NODE leads (0.3 against 0.6); on the seed both
            # have, 0, Neural Laplace does (0.3 against 0.5)
            ("integro_de", "node"): {0: 0.5, 1: 0.1},
            ("integro_de", "neural_laplace"): {0: 0.3, 2: 0.9},
            ("spiral_dde", "node"): {0: 0.2},  # Neural Laplace has no spiral seed: no ranking
        }
    )
    best = {b.system: b for b in best_per_system(status)}
    integro, spiral = best["integro_de"], best["spiral_dde"]
    assert (integro.best, integro.shared_seeds, integro.shared_best) == (
        "node",
        (0,),
        "neural_laplace",
    )
    assert (spiral.best, spiral.shared_seeds, spiral.shared_best) == ("node", (), None)
    assert interim_ranking(best.values()) == (
        "; ranked on seed 0, which every method has recorded on 1 system: Neural Laplace best "
        "on 1 of 1"
    )


def test_the_interim_answer_names_the_other_winners_and_mixed_seed_sets():
    status = _status(
        {
            ("integro_de", "node"): {0: 0.1, 1: 0.2},
            ("integro_de", "neural_laplace"): {0: 0.3, 1: 0.4},
            ("spiral_dde", "node"): {0: 0.5, 2: 0.0},
            ("spiral_dde", "neural_laplace"): {0: 0.4},
        }
    )
    best = list(best_per_system(status))
    assert [(b.system, b.shared_seeds, b.shared_best) for b in best] == [
        ("integro_de", (0, 1), "node"),
        ("spiral_dde", (0,), "neural_laplace"),
    ]
    assert interim_ranking(best) == (
        "; ranked on the seeds they share, which every method has recorded on 2 systems: "
        "Neural Laplace best on 1 of 2 (node on integro_de)"
    )
    assert interim_ranking([]) == ""
