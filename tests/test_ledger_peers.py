"""The Laplace-domain peers (Laplace-Net, the Laplace Neural Operator, the neural DDE) in the
ledger: their cells after Table 3's and the ablation's, one cell under both profiles, trained
last, counted apart from Table 3; their table and the page generated from the records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cells import ledger_record as _record

from flows.ledger import ledger_groups, to_train
from flows.ledger.text import status_text, tables
from flows.peers_page import peers_markdown
from tasks.config.names import MAIN_SYSTEMS, METHODS, PAPER_METHODS
from tasks.ledger.peers import NOT_RECORDED, peers_table
from tasks.ledger.quick_record import QuickCell, QuickRun
from tasks.ledger.scope import PEERS, LedgerCell, LedgerScope, scope_of
from tasks.ledger.views import cell_states, ledger_status
from tasks.reports.tables import render_table

RECORDED = json.loads((Path(__file__).parent / "data" / "profile_cells.json").read_text())


def test_the_peers_are_the_main_tables_models_the_paper_does_not_run():
    assert PEERS == ("neural_dde", "laplace_net", "lno")
    assert METHODS == (*PAPER_METHODS, *PEERS)
    assert PAPER_METHODS == (
        "node",
        "anode",
        "latent_ode",
        "nf_coupling",
        "nf_resnet",
        "neural_laplace",
    )


@pytest.fixture(scope="module")
def paper_scope() -> LedgerScope:
    """The paper profile's whole scope (config hashes computed; numerics faked)."""
    return scope_of(numerics=lambda cell: "today")


def test_the_scope_holds_table3_then_the_ablation_then_the_peers_90_cells(paper_scope):
    cells = paper_scope.cells
    table3 = [c for c in cells if not c.ablation and not c.peer]
    ablation = [c for c in cells if c.ablation]
    peers = [c for c in cells if c.peer]
    assert (len(table3), len(ablation), len(peers)) == (180, 30, 90)
    assert list(cells) == [*table3, *ablation, *peers]  # the peers come last
    # Table 3's cells keep the config hashes the fixture pinned before the peers were added
    pinned = {k: v["config_hash"] for k, v in RECORDED["paper"].items()}
    assert {f"{c.system}/{c.method}/seed{c.seed}": c.config_hash for c in table3} == pinned
    assert {(c.system, c.method, c.seed) for c in peers} == {
        (s, m, seed) for s in MAIN_SYSTEMS for m in PEERS for seed in range(5)
    }
    # the default selection is Table 3's (its "N of 180"): the peers only when asked for
    assert paper_scope.select() == table3
    assert paper_scope.select(ablations=None) == [*table3, *ablation]
    assert paper_scope.select(peers=True) == peers
    assert paper_scope.select(ablations=None, peers=None) == list(cells)
    assert paper_scope.select(methods=["lno"], peers=None) == [
        c for c in peers if c.method == "lno"
    ]


def test_a_peers_cell_is_the_same_under_the_paper_and_the_fair_profile(paper_scope):
    """They have no reference-code protocol: one record serves both profiles."""
    fair = scope_of(methods=list(PEERS), numerics=lambda cell: "today", profile="fair")
    assert {c.key: c.config_hash for c in fair.cells} == {
        c.key: c.config_hash for c in paper_scope.cells if c.peer
    }


def _cell(system, method, seed, ablation="") -> LedgerCell:
    return LedgerCell(
        system, method, seed, f"{system}-{method}-{ablation}-{seed}", "today", ablation
    )


def _scope(systems=("integro_de", "spiral_dde"), seeds=(0, 1, 2)) -> LedgerScope:
    """A synthetic scope in the ledger's order: Table 3 (NODE, Neural Laplace), the ablation,
    the peers."""
    cells = [_cell(s, m, k) for m in ("node", "neural_laplace") for s in systems for k in seeds]
    cells += [_cell(s, "neural_laplace", k, "stereographic=False") for s in systems for k in seeds]
    cells += [_cell(s, m, k) for m in PEERS for s in systems for k in seeds]
    return LedgerScope(tuple(cells), tuple(seeds), frozenset(systems), frozenset(METHODS))


def _at(scope: LedgerScope, system, method, seed, **kw):
    (cell,) = [c for c in scope.cells if c.key == (system, method, "", "", seed)]
    return _record(system, method, seed, config_hash=cell.config_hash, **kw)


def test_run_trains_the_peers_last_seed_0_first_then_the_rest():
    scope = _scope()
    records = [_at(scope, s, "node", 0) for s in ("integro_de", "spiral_dde")]
    states = cell_states(records, scope.select(ablations=None, peers=None))
    order = [(g.method, g.ablation, g.seeds) for g in ledger_groups(to_train(states), states)]
    peers_at = [i for i, (m, _, _) in enumerate(order) if m in PEERS]
    assert peers_at == list(range(len(order) - 9, len(order)))  # after Table 3 and the ablation
    assert order[-9:] == [
        ("neural_dde", "", (0,)),
        ("laplace_net", "", (0,)),
        ("lno", "", (0,)),
        *((m, "", (k,)) for k in (1, 2) for m in PEERS),
    ]
    merged = ledger_groups(to_train(states), states, merge_seeds=True)
    assert [(g.method, g.seeds) for g in merged][-3:] == [(m, (0, 1, 2)) for m in PEERS]


def test_status_counts_the_peers_apart_from_table_3():
    scope = _scope()
    records = [_at(scope, "integro_de", "lno", 0), _at(scope, "integro_de", "node", 0)]
    status = ledger_status(records, scope.select(ablations=None, peers=None))
    text = status_text(status, Path("ledger.jsonl"))
    assert "Table 3: 1 of 12 selected cells recorded" in text
    assert "the Laplace-domain peers (not Table 3's): 1 of 18 selected cells recorded" in text
    assert len(status.counted(ablation=False)) == 1 and len(status.counted(peers=True)) == 1


def _known_ledger(scope: LedgerScope):
    """Records with hand-checkable summaries on integro_de; spiral_dde has NL's one seed only."""
    values = {
        "neural_laplace": [0.02, 0.04],  # 0.03 ± 0.01414
        "node": [0.5, 0.7, 0.6],  # 0.6 ± 0.1
        "laplace_net": [0.01, 0.02, 0.03],  # 0.02 ± 0.01: the lowest
        "lno": [0.25],  # one seed: no spread
    }
    records = [
        _at(scope, "integro_de", m, k, test_rmse=v)
        for m, vs in values.items()
        for k, v in enumerate(vs)
    ]
    records.append(_at(scope, "spiral_dde", "neural_laplace", 0, test_rmse=0.123))
    return records


def test_the_peers_table_is_the_hand_computed_mean_and_std():
    scope = _scope()
    status = ledger_status(_known_ledger(scope), scope.select(ablations=False, peers=None))
    text = render_table(peers_table(status), "markdown")
    integro = next(line for line in text.splitlines() if line.startswith("| integro_de"))
    cells = [c.strip() for c in integro.strip("|").split("|")]
    assert cells == [
        "integro_de",
        "0.03 ± 0.01414 (n=2)",
        NOT_RECORDED,  # the neural DDE
        "0.02 ± 0.01 (n=3)",
        "0.25 (n=1)",
        "0.6 ± 0.1 (n=3, NODE)",
        "LaplaceNet (so far)",  # not every cell of the system is recorded
    ]
    spiral = next(line for line in text.splitlines() if line.startswith("| spiral_dde"))
    assert spiral.count(NOT_RECORDED) == 4 and "| NL (so far) |" in spiral
    assert "Laplace-domain peers: 4 of 18 cells recorded." in tables(status, "markdown")


def test_the_page_states_the_protocol_and_the_quick_cells():
    scope = _scope()
    quick = QuickRun(
        "quick",
        "c" * 40,
        None,
        60.0,
        50.0,
        2,
        0,
        "a CPU",
        "2026-11-29",
        tuple(
            QuickCell("integro_de", m, 0, v, "h", "c" * 40, "n", "cpu", "a CPU", 5.0, e, "r")
            for m, v, e in (("neural_laplace", 0.05, 235), ("lno", 0.07, 90))
        ),
    )
    page = peers_markdown(_known_ledger(scope), scope, quick, "5 seeds of 1000 epochs")
    assert "at the paper's budget (5 seeds of 1000 epochs)" in page
    assert "`--profile paper` and `--profile fair` configure each of their cells alike" in page
    assert "0.02 ± 0.01 (n=3)" in page and "Laplace-domain peers: 4 of 18 cells recorded." in page
    assert "| NL (235 epochs) | NDDE (– epochs) | LaplaceNet (– epochs) | LNO (90 epochs) |" in page
    assert "| integro_de | 0.05 | – | – | 0.07 |" in page
    assert "No quick run with the peers" in peers_markdown([], scope, None, "b")


@pytest.mark.slow  # about 30 s: three models trained on a busy 2-core machine
def test_a_smoke_benchmark_of_the_three_on_integro_de_finishes_every_cell(
    mlflow_store, prefect_server
):
    import math

    from flows.benchmark import run_benchmark
    from tasks.config import resolve_config

    overrides = {
        "systems": ["integro_de"],
        "methods": list(PEERS),
        "isolation": "thread",
        "max_workers": 1,
        "progress": False,
    }
    summary = run_benchmark(resolve_config("smoke", overrides=overrides))
    assert summary.ok
    assert sorted((r.method, r.status) for r in summary.results) == sorted(
        (m, "finished") for m in PEERS
    )
    assert all(math.isfinite(r.test_rmse) for r in summary.results)


def test_the_command_shows_the_peers_apart_and_alone_when_asked(tmp_path, capsys):
    from flows.cli import main
    from tasks.ledger import append_records
    from tasks.ledger.scope import ledger_scope

    (cell,) = ledger_scope().select(["integro_de"], ["lno"], [0], peers=True)
    path = tmp_path / "ledger.jsonl"
    append_records(path, [_record("integro_de", "lno", 0, config_hash=cell.config_hash)])
    assert main(["ledger", "table", "--ledger", str(path), "--peers"]) == 0
    out = capsys.readouterr().out
    assert "Laplace-domain peers: 1 of 90 cells recorded." in out and "Table 3" in out
    assert "cells of Table 3 recorded" not in out  # the peers alone
    assert main(["ledger", "status", "--ledger", str(path), "--no-ablation"]) == 0
    out = capsys.readouterr().out
    assert "Table 3: 0 of 180 selected cells recorded" in out and "peers" not in out
    assert main(["ledger", "status", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "the Laplace-domain peers (not Table 3's): 1 of 90 selected cells recorded" in out


def test_the_main_table_says_a_peer_is_not_in_the_paper():
    from tasks.reports.reporting import results_table
    from tasks.results import CellResult

    rows = [
        CellResult("integro_de", m, 0, "finished", test_rmse=v)
        for m, v in (("node", 0.3), ("lno", 0.2))
    ]
    text = results_table(rows, profile="quick").to_markdown()
    assert "| lno | **0.2** (not in the paper) |" in text
    assert "| node | 0.3 (paper 0.073 ± 0.0016) |" in text
