"""Results table: mean ± std over seeds per method × system, best in bold, the paper alongside."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from tasks.config import MAIN_SYSTEMS, METHODS

__all__ = [
    "PAPER_MAIN_TABLE",
    "CellResult",
    "Published",
    "ResultsTable",
    "results_table",
]

CellStatus = Literal["finished", "reused", "failed", "interrupted", "missing"]


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


@dataclass(frozen=True)
class CellResult:
    """Outcome of one cell, as the report needs it."""

    system: str
    method: str
    seed: int
    status: CellStatus
    test_rmse: float | None = None
    run_id: str | None = None
    config_hash: str | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.system}/{self.method}/seed{self.seed}"

    @property
    def ok(self) -> bool:
        return self.status in ("finished", "reused") and self.test_rmse is not None


def _order(names: Iterable[str], preferred: Sequence[str]) -> list[str]:
    names = set(names)
    return [n for n in preferred if n in names] + sorted(names - set(preferred))


def _fmt(mean: float, std: float) -> str:
    return f"{mean:.4f} ± {std:.4f}"


@dataclass(frozen=True)
class ResultsTable:
    """Long table (one row per method × system) with renderers for CSV, Markdown and LaTeX."""

    frame: pd.DataFrame

    @property
    def methods(self) -> list[str]:
        return _order(self.frame["method"], METHODS)

    @property
    def systems(self) -> list[str]:
        return _order(self.frame["system"], MAIN_SYSTEMS)

    def _best(self) -> dict[str, str]:
        ok = self.frame.dropna(subset=["mean"])
        return {s: g.loc[g["mean"].idxmin(), "method"] for s, g in ok.groupby("system")}

    def _cell(self, method: str, system: str, bold: tuple[str, str], paper: str) -> str:
        rows = self.frame[(self.frame.method == method) & (self.frame.system == system)]
        if rows.empty:
            return "–"
        r = rows.iloc[0]
        if np.isnan(r["mean"]):
            text = "failed" if r["n_failed"] else "–"
        else:
            text = _fmt(r["mean"], r["std"])
            if self._best().get(system) == method:
                text = f"{bold[0]}{text}{bold[1]}"
        if not np.isnan(r["paper_mean"]):
            text += paper.format(_fmt(r["paper_mean"], r["paper_std"]))
        return text

    def to_csv(self) -> str:
        return self.frame.to_csv(index=False, float_format="%.6g")

    def to_markdown(self) -> str:
        head = "| method | " + " | ".join(self.systems) + " |"
        lines = [head, "|" + "---|" * (len(self.systems) + 1)]
        for m in self.methods:
            cells = [self._cell(m, s, ("**", "**"), " (paper {})") for s in self.systems]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append(
            "Test RMSE (normalised, extrapolated half), mean ± std over seeds; best per system in "
            "bold; the paper's figure (5 seeds, N = 1000, 1000 epochs) in brackets."
        )
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        def esc(s: str) -> str:
            return s.replace("_", r"\_")

        cols = "l" + "c" * len(self.systems)
        lines = [
            rf"\begin{{tabular}}{{{cols}}}",
            r"\toprule",
            "method & " + " & ".join(esc(s) for s in self.systems) + r" \\",
            r"\midrule",
        ]
        for m in self.methods:
            cells = [
                self._cell(m, s, (r"\textbf{", "}"), r" {{\scriptsize ({})}}").replace(
                    "±", r"$\pm$"
                )
                for s in self.systems
            ]
            lines.append(esc(m) + " & " + " & ".join(cells) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines) + "\n"

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


def results_table(results: Iterable[CellResult]) -> ResultsTable:
    """Aggregate cell results into mean ± std over seeds (population std, as numpy's default)."""
    rows = []
    by_key: dict[tuple[str, str], list[CellResult]] = {}
    for r in results:
        by_key.setdefault((r.method, r.system), []).append(r)
    for (method, system), cells in by_key.items():
        values = np.array([c.test_rmse for c in cells if c.ok], dtype=float)
        paper = PAPER_MAIN_TABLE.get((method, system))
        rows.append(
            {
                "method": method,
                "system": system,
                "n_seeds": len(values),
                "n_failed": sum(c.status in ("failed", "interrupted") for c in cells),
                "mean": float(values.mean()) if len(values) else float("nan"),
                "std": float(values.std()) if len(values) else float("nan"),
                "paper_mean": paper.mean if paper else float("nan"),
                "paper_std": paper.std if paper else float("nan"),
            }
        )
    columns = ["method", "system", "n_seeds", "n_failed", "mean", "std", "paper_mean", "paper_std"]
    return ResultsTable(pd.DataFrame(rows, columns=columns))
