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
    **_row("node", (.0389, .0029), (.3102, .0151), (.8225, .0403), (.2833, .0032), (.2274, .0298), (.0730, .0016)),  # noqa: E501
    **_row("anode", (.0365, .0011), (.2930, .0239), (.8214, .0415), (.2444, .0167), (.0644, .0211), (.0036, .0003)),  # noqa: E501
    **_row("latent_ode", (.0481, .0033), (.2182, .0153), (.0385, .0217), (.1932, .0154), (.1401, .0457), (.0109, .0009)),  # noqa: E501
    **_row("nf_coupling", (.6938, .1036), (.7266, .0310), (.0539, .0181), (.1829, .0209), (.0752, .0052), (.0042, .0013)),  # noqa: E501
    **_row("nf_resnet", (.1905, .0479), (.2257, .0608), (.0350, .0223), (.1468, .0396), (.0399, .0119), (.0027, .0004)),  # noqa: E501
    **_row("neural_laplace", (.0331, .0023), (.0475, .0061), (.0282, .0246), (.1314, .0218), (.0035, .0004), (.0014, .0005)),  # noqa: E501
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
                self._cell(m, s, (r"\textbf{", "}"), r" {{\scriptsize ({})}}").replace("±", r"$\pm$")
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
        for ext, text in (("csv", self.to_csv()), ("md", self.to_markdown()), ("tex", self.to_latex())):
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
