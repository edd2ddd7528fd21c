"""Write ``tests/module_seconds.json``: each test module's seconds in a timed run of the suite,
from that run's JUnit report, for the order ``tests/conftest.py`` hands modules out in (the
longest first, so that two pytest-xdist workers finish together).

    python -m pytest -q -n 2 --dist loadfile --junitxml=run.xml
    python scripts/module_seconds.py run.xml [more.xml ...]

A module in several reports keeps the largest of its figures (the heavy tier's modules run in
both tiers' reports)."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "module_seconds.json"


def module_seconds(report: Path) -> dict[str, float]:
    """Seconds per test module (``tests/test_x.py``) in the JUnit ``report``: its test cases'
    times (set-up, call and tear-down) added up."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x[.TestClass]
        named = next((i for i, p in enumerate(parts) if p.startswith("test_")), None)
        if named is not None:
            module = "/".join(parts[: named + 1]) + ".py"
            seconds[module] += float(case.get("time") or 0)
    return dict(seconds)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path, help="JUnit XML reports of suite runs")
    args = ap.parse_args(argv)
    merged: dict[str, float] = {}
    for report in args.reports:
        if not report.is_file():
            ap.error(f"{report}: no such file")
        try:
            found = module_seconds(report)
        except ET.ParseError as e:
            ap.error(f"{report}: not a JUnit XML report ({e})")
        for module, s in found.items():
            merged[module] = max(merged.get(module, 0.0), s)
    ordered = dict(sorted(((m, round(s, 1)) for m, s in merged.items()), key=lambda x: -x[1]))
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"wrote {OUT} ({len(ordered)} modules, {sum(ordered.values()):.0f} s in all)")


if __name__ == "__main__":
    main()
