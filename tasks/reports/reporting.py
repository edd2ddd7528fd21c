"""Results table: mean ± std over seeds per method × system, best in bold, the paper alongside.

The tables themselves (:class:`~tasks.reports.tables.Table`,
:func:`~tasks.reports.tables.render_table`) live in :mod:`tasks.reports.tables`, importable from
here too; ours against the paper is judged by the one :func:`tasks.reports.verdict.verdict`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from tasks.config import MAIN_SYSTEMS, METHODS, PAPER_BUDGET_PROFILES
from tasks.config.names import MODEL_CARDS, model_label
from tasks.reports.tables import NOT_IN_PAPER, Table, TableCell, number, render_table
from tasks.reports.verdict import VERDICT_RULE, Verdict, verdict
from tasks.results import CellResult

__all__ = [
    "PAPER_BUDGET",
    "PAPER_MAIN_TABLE",
    "PAPER_STEREOGRAPHIC",
    "TOP_SHARE_FLAG",
    "CellScore",
    "Published",
    "ResultsTable",
    "Table",
    "TableCell",
    "parent_summary",
    "render_table",
    "results_table",
]


class CellScore(Protocol):
    """What :func:`results_table` reads of a cell's outcome: a :class:`~tasks.results.
    CellResult`, or a record of the ledger (``tasks.ledger.LedgerRecord``)."""

    @property
    def system(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def test_rmse(self) -> float | None: ...
    @property
    def top_share(self) -> float | None: ...
    @property
    def rmse_without_top(self) -> float | None: ...
    @property
    def diverged(self) -> str | None: ...


@dataclass(frozen=True)
class Published:
    """A published figure: test RMSE mean ± std over 5 seeds."""

    mean: float
    std: float


def _row(method: str, *pairs: tuple[float, float]) -> dict[tuple[str, str], Published]:
    return {(method, s): Published(m, sd) for s, (m, sd) in zip(MAIN_SYSTEMS, pairs, strict=True)}


#: The paper's main table (Table 3): (method, system) -> published test RMSE.
PAPER_MAIN_TABLE: dict[tuple[str, str], Published] = {
    **_row(
        "node",
        (0.0389, 0.0029),
        (0.3102, 0.0151),
        (0.8225, 0.0403),
        (0.2833, 0.0032),
        (0.2274, 0.0298),
        (0.0730, 0.0016),
    ),
    **_row(
        "anode",
        (0.0365, 0.0011),
        (0.2930, 0.0239),
        (0.8214, 0.0415),
        (0.2444, 0.0167),
        (0.0644, 0.0211),
        (0.0036, 0.0003),
    ),
    **_row(
        "latent_ode",
        (0.0481, 0.0033),
        (0.2182, 0.0153),
        (0.0385, 0.0217),
        (0.1932, 0.0154),
        (0.1401, 0.0457),
        (0.0109, 0.0009),
    ),
    **_row(
        "nf_coupling",
        (0.6938, 0.1036),
        (0.7266, 0.0310),
        (0.0539, 0.0181),
        (0.1829, 0.0209),
        (0.0752, 0.0052),
        (0.0042, 0.0013),
    ),
    **_row(
        "nf_resnet",
        (0.1905, 0.0479),
        (0.2257, 0.0608),
        (0.0350, 0.0223),
        (0.1468, 0.0396),
        (0.0399, 0.0119),
        (0.0027, 0.0004),
    ),
    **_row(
        "neural_laplace",
        (0.0331, 0.0023),
        (0.0475, 0.0061),
        (0.0282, 0.0246),
        (0.1314, 0.0218),
        (0.0035, 0.0004),
        (0.0014, 0.0005),
    ),
}


#: The paper's Table 5 (``Table:ablate``, top block): test RMSE of Neural Laplace with the
#: stereographic map off and on, per system, mean ± std over 5 runs (four of the six systems).
PAPER_STEREOGRAPHIC: dict[str, tuple[Published, Published]] = {
    "lotka_volterra_dde": (Published(0.1617, 0.0741), Published(0.0614, 0.0469)),
    "stiff_van_der_pol": (Published(0.1836, 0.0586), Published(0.1286, 0.0170)),
    "piecewise_forcing_ode": (Published(0.0249, 0.0066), Published(0.0036, 0.0007)),
    "integro_de": (Published(0.0048, 0.0007), Published(0.0013, 0.0003)),
}


def _order(names: Iterable[str], preferred: Sequence[str]) -> list[str]:
    names = set(names)
    return [n for n in preferred if n in names] + sorted(names - set(preferred))


def _short(method: str) -> str:
    """A method's short name in one-line rankings: its registration's label."""
    return model_label(method)


def _fmt(mean: float, std: float | None) -> str:
    """``mean ± std``, or the mean alone where there is no spread to show (one seed)."""
    return number(mean) if std is None else f"{number(mean)} ± {number(std)}"


def _row_verdict(row: pd.Series) -> Verdict:
    """:func:`tasks.reports.verdict.verdict` of one row of a :class:`ResultsTable`'s frame."""
    return verdict(
        row["mean"], row["std"], int(row["n_seeds"]), row["paper_mean"], row["paper_std"]
    )


#: A cell whose few largest squared errors carry more than this share of the total is flagged.
TOP_SHARE_FLAG = 0.5


#: How the best cell of a column is marked: bold, which a terminal shows as ``*``.
_BEST, _BEST_TERMINAL = "best per system in bold", "best per system marked *"
#: The training budget behind the paper's Table 3; only the ``paper`` profile trains it.
PAPER_BUDGET = "5 seeds × 1000 epochs, N = 1000"
_HEAD = (
    f"Test RMSE (normalised, extrapolated half), mean ± std (sample std, ddof 1) over seeds; "
    f"{_BEST}; "
)
_CAPTION = f"{_HEAD}the paper's figure ({PAPER_BUDGET}) in brackets; {VERDICT_RULE}."


def _caption_other_budget(profile: str) -> str:
    return (
        f"{_HEAD}in brackets the paper's figure, for another budget ({PAPER_BUDGET}) than the "
        f"{profile} profile's, so no verdict is drawn (the paper profile trains its budget)."
    )


@dataclass(frozen=True)
class ResultsTable:
    """Long table (one row per method × system); :meth:`main_table` lays it out as the paper's
    Table 3 (methods × systems) for :func:`render_table`. Ours are judged against the paper's
    figures (▲ ✓ ▼) only when ``profile`` trains the paper's budget; other profiles show the
    figure beside ours, marked as another budget."""

    frame: pd.DataFrame
    profile: str

    @property
    def judged(self) -> bool:
        """Whether the paper's figures are this profile's yardstick (same budget)."""
        return self.profile in PAPER_BUDGET_PROFILES

    @property
    def methods(self) -> list[str]:
        return _order(self.frame["method"], METHODS)

    @property
    def systems(self) -> list[str]:
        return _order(self.frame["system"], MAIN_SYSTEMS)

    def _best(self) -> dict[str, str]:
        ok = self.frame.dropna(subset=["mean"])
        if "n_diverged" in ok:  # a method whose every seed diverged is never the best
            ok = ok[ok["n_diverged"] < ok["n_seeds"]]
        return {s: g.loc[g["mean"].idxmin(), "method"] for s, g in ok.groupby("system")}

    def _cell(
        self,
        method: str,
        system: str,
        links: Mapping[tuple[str, str], str],
        seeds: bool = False,
        note: str = "",
    ) -> TableCell:
        rows = self.frame[(self.frame.method == method) & (self.frame.system == system)]
        if rows.empty:
            return TableCell("–")
        r = rows.iloc[0]
        paper = "" if np.isnan(r["paper_mean"]) else _fmt(r["paper_mean"], r["paper_std"])
        if not paper:  # no figure: a model of the project's the paper does not run, else a
            # user's system or model
            card = MODEL_CARDS.get(method)
            paper = NOT_IN_PAPER if card is not None and not card.paper_table else "—"
        if np.isnan(r["mean"]):
            return TableCell("failed" if r["n_failed"] else "–", paper=paper)
        flag = ""
        if r.get("n_diverged", 0):  # tables written before the column have none
            flag = f"diverged in {r['n_diverged']} of {r['n_seeds']} seeds: never registered"
        elif np.isfinite(r["top_share"]) and r["top_share"] > TOP_SHARE_FLAG:
            flag = (
                f"dominated by a few samples ({r['top_share']:.0%} of the error); "
                f"{number(r['rmse_without_top'])} without them"
            )
        text = _fmt(r["mean"], r["std"] if r["n_seeds"] > 1 else None)
        count = f"n={r['n_seeds']}" + (f"; {note}" if note else "")
        return TableCell(
            f"{text} ({count})" if seeds else text,
            paper=paper,
            best=self._best().get(system) == method,
            verdict=_row_verdict(r) if self.judged else "",
            link=links.get((method, system)),
            flag=flag,
        )

    def main_table(
        self,
        links: Mapping[tuple[str, str], str] | None = None,
        *,
        seeds: bool = False,
        notes: Mapping[tuple[str, str], str] | None = None,
    ) -> Table:
        """Methods × systems, ours beside the paper's mean ± std; ``links`` (method, system) →
        URL makes a cell a link (its runs in the MLflow UI); ``seeds``: each cell says how many
        seeds its mean is over, with the ``notes`` (method, system) → text beside the count."""
        links, notes = links or {}, notes or {}
        rows = tuple(
            (
                TableCell(m),
                *(self._cell(m, s, links, seeds, notes.get((m, s), "")) for s in self.systems),
            )
            for m in self.methods
        )
        caption = _CAPTION if self.judged else _caption_other_budget(self.profile)
        return Table(("method", *self.systems), rows, caption)

    def verdicts(self) -> dict[tuple[str, str], Verdict]:
        """(method, system) → the verdict its cell shows ("" where not judged)."""
        return {
            (r["method"], r["system"]): _row_verdict(r) if self.judged else ""
            for _, r in self.frame.iterrows()
        }

    def ranking(self) -> Table:
        """Per system, the methods from best to worst by mean test RMSE, ours beside the
        paper's order of the same methods, whether the winner agrees, and Kendall's τ
        between the two orders (1: the same order, −1: reversed)."""
        from scipy.stats import kendalltau

        rows = []
        for system in self.systems:
            col = self.frame[(self.frame.system == system) & self.frame["mean"].notna()]
            col = col[col["paper_mean"].notna()]
            if len(col) < 2:
                continue
            ours = col.sort_values(["mean", "method"])
            paper = col.sort_values(["paper_mean", "method"])
            tau = float(kendalltau(ours["mean"], ours["paper_mean"]).statistic)
            same = ours["method"].iloc[0] == paper["method"].iloc[0]
            rows.append(
                (
                    TableCell(system),
                    TableCell(" < ".join(_short(m) for m in ours["method"])),
                    TableCell(" < ".join(_short(m) for m in paper["method"])),
                    # coloured, not marked: ▲ ✓ ▼ are the verdict against the paper's figure
                    TableCell(
                        "yes" if same else "no", verdict="match" if same else "worse", mark=False
                    ),
                    TableCell(f"{tau:+.2f}"),
                )
            )
        return Table(
            ("system", "ours, best first", "paper, best first", "same winner", "Kendall τ"),
            tuple(rows),
            "Ranking by mean test RMSE (lower first), among the methods both tables have.",
        )

    def to_csv(self) -> str:
        return self.frame.to_csv(index=False, float_format="%.6g")

    def to_markdown(self) -> str:
        return render_table(self.main_table(), "markdown")

    def to_latex(self) -> str:
        return render_table(self.main_table(), "latex")

    def to_terminal(self, width: int = 100, color: bool = False) -> str:
        table = self.main_table()
        table = replace(table, caption=table.caption.replace(_BEST, _BEST_TERMINAL))
        return render_table(table, "terminal", width=width, color=color)

    def write(self, folder: str | Path, stem: str = "results") -> list[Path]:
        """Write ``stem.csv``, ``stem.md`` and ``stem.tex`` into ``folder``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for ext, text in (
            ("csv", self.to_csv()),
            ("md", self.to_markdown()),
            ("tex", self.to_latex()),
        ):
            p = out / f"{stem}.{ext}"
            p.write_text(text)
            paths.append(p)
        return paths

    def texts(self) -> dict[str, str]:
        """``{csv, md, tex}`` texts, as :meth:`write` would write them."""
        return {"csv": self.to_csv(), "md": self.to_markdown(), "tex": self.to_latex()}


def parent_summary(
    results: Sequence[CellResult], title: str, profile: str
) -> tuple[str, dict[str, float]]:
    """A parent run's description (Markdown, for the ``mlflow.note.content`` tag) and its
    summary metrics: cell counts, the mean test RMSE and, in the paper profile (the paper's
    budget), the win count against the paper."""
    table = results_table(results, profile=profile)
    ok = [r for r in results if r.ok]
    metrics = {
        "cells": float(len(results)),
        "cells_ok": float(len(ok)),
        "cells_failed": float(sum(r.status in ("failed", "interrupted") for r in results)),
        "mean_test_rmse": float(np.mean([r.test_rmse for r in ok])) if ok else float("nan"),
    }
    text = (
        f"**{title}**: {len(ok)} of {len(results)} cells finished "
        f"({int(metrics['cells_failed'])} failed). "
    )
    if table.judged:
        f = table.frame
        verdicts = [_row_verdict(r) for _, r in f.iterrows()]
        for v in ("better", "match", "worse", "unclear"):
            metrics[f"paper_{v}"] = float(verdicts.count(v))
        text += (
            f"Against the paper's Table 3: {verdicts.count('better')} better, "
            f"{verdicts.count('match')} matching, {verdicts.count('worse')} worse, "
            f"{verdicts.count('unclear')} unclear ({VERDICT_RULE})."
        )
    else:
        text += f"The paper's Table 3 is another budget ({PAPER_BUDGET}): shown, not judged."
    text += "\n\n" + table.to_markdown()
    ranking = table.ranking()
    if ranking.rows:
        text += "\n\n" + render_table(ranking, "markdown")
    return text, metrics


def results_table(
    results: Iterable[CellScore],
    *,
    profile: str,
    expected: Iterable[tuple[str, str]] = (),
) -> ResultsTable:
    """Aggregate cell results into mean ± std over seeds (the sample std, ddof 1: NaN for one);
    ``profile``: the profile they were trained in (the paper's figures judge the paper's);
    ``expected``: (method, system) pairs that get their row, "–", even with no result."""
    rows = []
    by_key: dict[tuple[str, str], list[CellScore]] = {pair: [] for pair in expected}
    for r in results:
        by_key.setdefault((r.method, r.system), []).append(r)
    for (method, system), cells in by_key.items():
        values = np.array([c.test_rmse for c in cells if c.ok], dtype=float)
        paper = PAPER_MAIN_TABLE.get((method, system))
        shares = [c.top_share for c in cells if c.ok and c.top_share is not None]
        without = [c.rmse_without_top for c in cells if c.ok and c.rmse_without_top is not None]
        rows.append(
            {
                "method": method,
                "system": system,
                "n_seeds": len(values),
                "n_failed": sum(c.status in ("failed", "interrupted") for c in cells),
                "n_diverged": sum(c.ok and c.diverged is not None for c in cells),
                "mean": float(values.mean()) if len(values) else float("nan"),
                "std": float(values.std(ddof=1)) if len(values) > 1 else float("nan"),
                "paper_mean": paper.mean if paper else float("nan"),
                "paper_std": paper.std if paper else float("nan"),
                "top_share": max(shares) if shares else float("nan"),
                "rmse_without_top": float(np.mean(without)) if without else float("nan"),
            }
        )
    columns = [
        "method",
        "system",
        "n_seeds",
        "n_failed",
        "mean",
        "std",
        "paper_mean",
        "paper_std",
        "top_share",
        "rmse_without_top",
        "n_diverged",
    ]
    return ResultsTable(pd.DataFrame(rows, columns=columns), profile)
