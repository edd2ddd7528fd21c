"""The HTML report opened in a real headless browser (Debian's ``chromium``, driven by playwright;
never a downloaded browser): every image decodes, the console stays clean, and every main-table
cell shows the mean ± std computed here from the cell results."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.heavy,  # a browser driven over a report and the docs site
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="Debian's chromium is not installed (.ci/run installs it)",
    ),
]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

SYSTEMS = ("spiral_dde", "integro_de")
METHODS = ("node", "anode", "latent_ode", "nf_coupling", "nf_resnet", "neural_laplace")


@dataclass(frozen=True)
class PageFacts:
    title: str
    header: list[str]
    rows: list[list[str]]
    images: list[tuple[str, bool]]  # (alt, decoded with a width)
    console: list[str]  # console errors and uncaught page errors


def open_in_browser(path: Path) -> PageFacts:
    """Load ``path`` in headless chromium and read back what a reader would see."""
    console: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on(
                "console",
                lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(path.resolve().as_uri(), wait_until="load")
            main = page.locator("table").first
            header = main.locator("thead th").all_inner_texts()
            rows = [r.locator("td").all_inner_texts() for r in main.locator("tbody tr").all()]
            images = page.evaluate(
                "Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])"
            )
            facts = PageFacts(page.title(), header, rows, [tuple(i) for i in images], console)
        finally:
            browser.close()
    return facts


def _results():
    from tasks.results import CellResult

    rng = np.random.default_rng(3)
    out = []
    for s in SYSTEMS:
        for m in METHODS:
            for seed in (0, 1):
                if (s, m) == ("integro_de", "node"):
                    out.append(CellResult(s, m, seed, "failed", error="diverged"))
                    continue
                share = 0.8 if (s, m) == ("spiral_dde", "anode") else 0.1
                out.append(
                    CellResult(
                        s,
                        m,
                        seed,
                        "finished",
                        float(rng.uniform(0.001, 0.3)),
                        f"run{s}{m}{seed}",
                        top_share=share,
                        rmse_without_top=0.01,
                    )
                )
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("browser")
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
        mp.setenv("NLLAB_ARTIFACT_ROOT", str(folder / "artifacts"))
        from flows.reports.report_full import build_report
        from tasks.tracking import connect

        results = _results()
        paths = build_report(
            connect().queries,
            folder / "out",
            results=results,
            profile="paper",
            ui_address="http://127.0.0.1:5000",
        )
        yield paths, results


def test_report_in_a_real_browser(report):
    paths, results = report
    facts = open_in_browser(paths.html)
    assert facts.title == "Neural Laplace Lab report"
    assert facts.console == []
    assert facts.images and all(ok for _, ok in facts.images), facts.images
    assert facts.header == ["method", *SYSTEMS]
    assert [r[0] for r in facts.rows] == list(METHODS)
    for row in facts.rows:
        for system, text in zip(SYSTEMS, row[1:], strict=True):
            values = [
                r.test_rmse for r in results if r.ok and (r.method, r.system) == (row[0], system)
            ]
            if not values:
                assert text.startswith("failed"), text
                continue
            expected = f"{np.mean(values):.4g} ± {np.std(values, ddof=1):.4g}"
            assert text.startswith(expected), (row[0], system, text)
            assert "paper " in text  # the paper's figure beside ours
    flagged = facts.rows[METHODS.index("anode")][1]
    assert "dominated by a few samples" in flagged and "0.01 without them" in flagged


def test_the_browser_check_catches_a_broken_page(report, tmp_path):
    paths, _ = report
    page = paths.html.read_text()
    broken = page.replace("data:image/png;base64,iVBOR", "data:image/png;base64,AAAA", 1)
    broken = broken.replace("</body>", "<script>console.error('boom')</script></body>")
    # drop the last main-table cell
    head, tail = broken.split("</tbody>", 1)
    head = head[: head.rindex("<td")] + "</tr>"
    bad = tmp_path / "bad.html"
    bad.write_text(head + "</tbody>" + tail)
    facts = open_in_browser(bad)
    assert not all(ok for _, ok in facts.images)
    assert any("boom" in c for c in facts.console)
    assert len(facts.rows[-1]) == len(SYSTEMS)  # one cell short of 1 + len(SYSTEMS)


# -- the documentation site ------------------------------------------------------------------
#: Pages a reader opens first, and the ones with the widest tables and code blocks.
SITE_PAGES = ("index.html", "results/quick.html", "architecture.html", "guide/gpu.html")


@pytest.fixture(scope="module")
def docs_site(tmp_path_factory) -> Path:
    """The documentation site as ``make docs`` builds it (--strict), into a scratch folder."""
    import os
    import subprocess
    import sys

    pytest.importorskip("material", reason="the docs extra is not installed (make docs does)")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("site")
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


#: What a page reports of itself: requests leaving the site are refused and listed.
_PAGE_FACTS = """() => {
  const lines = el => {
    const s = getComputedStyle(el);
    const inner = el.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom);
    return Math.round(inner / parseFloat(s.lineHeight));
  };
  const table = document.querySelector(".md-typeset table");
  return {
    pageScrolls: document.documentElement.scrollWidth > window.innerWidth,
    cellLines: table ? Array.from(table.querySelectorAll("tbody td")).map(lines) : [],
    clippedCode: Array.from(document.querySelectorAll("pre > code"))
      .filter(c => c.scrollWidth > c.clientWidth + 1).length,
  };
}"""


def test_the_docs_site_asks_nothing_outside_itself_and_reads_at_1280_pixels(docs_site):
    """Every page opened as files asks for nothing but the site's own files (no web fonts, no
    script from a CDN), logs no error, never scrolls sideways as a whole; a table's figures stay
    on one line (a wide table scrolls inside itself); code blocks fit the text's width."""
    site = docs_site.resolve().as_uri()
    outside: list[str] = []
    console: list[str] = []

    def route(r) -> None:
        if r.request.url.startswith((site, "data:", "blob:", "about:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    facts = {}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", route)
            page = context.new_page()
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            for name in SITE_PAGES:
                page.goto((docs_site / name).as_uri(), wait_until="networkidle")
                facts[name] = page.evaluate(_PAGE_FACTS)
            page.fill("input.md-search__input", "reproduce")  # search, from files
            # the search index is built in the page as it opens: a wait that ends once a result
            # shows, up to a minute (a loaded machine builds it slowly), as the UI's test waits
            page.wait_for_selector(".md-search-result__item", timeout=60_000)
        finally:
            browser.close()
    assert outside == [] and console == [], (outside, console)
    assert not any(f["pageScrolls"] for f in facts.values()), facts
    quick = facts["results/quick.html"]["cellLines"]
    quick_json = Path(__file__).resolve().parents[1] / "results" / "quick" / "quick.json"
    record = json.loads(quick_json.read_text())
    methods = {cell["method"] for cell in record["cells"]}
    systems = {cell["system"] for cell in record["cells"]}
    # a row per method: its name, then a figure per system, e.g. 0.1368 (paper 0.0389 ± 0.0029)
    assert len(quick) == len(methods) * (1 + len(systems)) and set(quick) == {1}, quick
    assert facts["architecture.html"]["clippedCode"] == 0
