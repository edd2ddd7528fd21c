"""One table renderer for the terminal, Markdown, LaTeX and HTML; resolved model arguments; run
names."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tasks.config import METHODS, CellConfig
from tasks.modelio import model_params, resolved_model_args
from tasks.reports.reporting import results_table
from tasks.reports.tables import Table, TableCell, render_table
from tasks.results import CellResult
from tasks.tracking import run_name

SYSTEMS = ("spiral_dde", "lotka_volterra_dde", "mackey_glass_dde", "integro_de")


def _table():
    rng = np.random.default_rng(0)
    results = [
        CellResult(s, m, seed, "finished", float(rng.uniform(0.001, 1.0)), f"run-{s}-{m}-{seed}")
        for s in SYSTEMS
        for m in METHODS
        for seed in (0, 1, 2)
    ]
    return results, results_table(results, profile="paper")


@pytest.mark.parametrize("width", [60, 80, 100, 140])
def test_terminal_table_fits_and_keeps_every_cell(width):
    results, table = _table()
    text = table.to_terminal(width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    for s in SYSTEMS:
        for m in METHODS:
            v = [r.test_rmse for r in results if (r.system, r.method) == (s, m)]
            assert f"{np.mean(v):.4g} ± {np.std(v, ddof=1):.4g}" in text


def test_a_table_keyed_by_two_columns_repeats_both_in_each_block_of_a_split_table():
    header = ("method", "system", *(f"column {i}" for i in range(8)))
    rows = tuple(
        tuple(TableCell(x) for x in (m, s, *(f"{i}.123456" for i in range(8))))
        for m in ("node", "anode")
        for s in ("spiral_dde", "integro_de")
    )
    text = render_table(Table(header, rows, keys=2), "terminal", width=60)
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert len(blocks) > 1 and max(len(line) for line in text.splitlines()) <= 60
    for block in blocks:
        head, _, *body = block.splitlines()
        assert head.split()[:2] == ["method", "system"], block
        assert [line.split()[:2] for line in body] == [
            ["node", "spiral_dde"],
            ["node", "integro_de"],
            ["anode", "spiral_dde"],
            ["anode", "integro_de"],
        ]
    one_key = render_table(Table(header, rows), "terminal", width=60)  # the default: one
    assert "system" not in one_key.split("\n\n")[1]


def test_every_format_shows_the_same_cells_and_marks_the_best():
    _, table = _table()
    main = table.main_table({("node", "spiral_dde"): "http://ui/#/runs/x"})
    texts = {f: render_table(main, f) for f in ("terminal", "markdown", "latex", "html")}
    best = {
        s: min(
            METHODS, key=lambda m: table.frame.set_index(["method", "system"]).loc[(m, s), "mean"]
        )
        for s in SYSTEMS
    }
    for row in main.rows:
        for s, cell in zip(SYSTEMS, row[1:], strict=True):
            assert cell.best == (best[s] == row[0].text)
            for f, text in texts.items():
                shown = cell.text.replace("±", r"$\pm$") if f == "latex" else cell.text
                assert shown in text, (f, cell.text)
    n_best = len(SYSTEMS)
    assert texts["markdown"].count("**") == 2 * n_best
    assert texts["latex"].count(r"\textbf{") == n_best
    assert texts["html"].count("<b>") == n_best
    assert '<a href="http://ui/#/runs/x">' in texts["html"]
    assert "](http://ui/#/runs/x)" in texts["markdown"]
    assert r"spiral\_dde" in texts["latex"] and "spiral_dde" not in texts["latex"]


def test_html_escapes_and_verdicts_colour():
    t = render_table(
        Table(("a", "b"), ((TableCell("<x>"), TableCell("1", verdict="worse")),)), "html"
    )
    assert "&lt;x&gt;" in t and "<x>" not in t
    assert re.search(r'<td style="background:#ffd9d9">1 <span class="mark">▼</span></td>', t)
    with pytest.raises(ValueError, match="terminal, markdown, latex, html"):
        render_table(_table()[1].main_table(), "pdf")


@pytest.mark.parametrize("method", METHODS)
def test_resolved_model_args_rebuild_the_default_model(method):
    from nlmodels import build_model

    args = resolved_model_args(method, 2, {})
    assert json.loads(json.dumps(args)) == args  # JSON values only
    rebuilt = build_model(
        method, **{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    )
    default = build_model(method, 2)
    assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in default.parameters()]
    over = resolved_model_args(method, 2, {"latent_dim": 7})
    assert over["latent_dim"] == 7
    params = model_params(args)
    assert params["model.state_dim"] == "2" and all(k.startswith("model.") for k in params)


def test_run_name_puts_method_and_variant_first():
    cell = CellConfig(system="lotka_volterra_dde", method="neural_laplace", seed=0)
    assert run_name(cell) == "neural_laplace · lotka_volterra_dde · s0"
    assert run_name(cell, "stereo=off") == "neural_laplace · lotka_volterra_dde · s0 · stereo=off"
    # by default the variant is what differs from the model's defaults and clean data
    off = cell.model_copy(update={"model": {"stereographic": False, "latent_dim": 2}})
    assert run_name(off) == "neural_laplace · lotka_volterra_dde · s0 · stereographic=False"
    noisy = cell.model_copy(update={"data": cell.data.model_copy(update={"noise_std": 0.1})})
    assert run_name(noisy).endswith(" · s0 · noise_std=0.1")
