"""``benchmarks/suite_time.py`` times what ``make test`` runs and reads pytest's own counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def suite_time(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is a folder of scripts, not installed
    import benchmarks.suite_time

    return benchmarks.suite_time


def test_the_timed_command_is_make_tests_recipe(suite_time, tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text(
        "test-slow: $(STAMP)\n\t$(PY) -m pytest -m slow\n\n"
        "test: $(STAMP)\n\t$(PY) -m pytest -q -n 2 --dist loadfile\n"
    )
    assert suite_time.make_test_command(makefile) == [
        sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile"
    ]  # fmt: skip
    real = suite_time.make_test_command()
    assert real[:3] == [sys.executable, "-m", "pytest"]  # the repository's own, runnable here


def test_counts_are_pytests_last_line(suite_time):
    last = "3 failed, 1033 passed, 3 skipped, 70 deselected, 2 warnings, 2 errors in 9.28s"
    assert suite_time.counts(last) == {
        "failed": 3, "passed": 1033, "skipped": 3, "deselected": 70, "errors": 2
    }  # fmt: skip
    assert suite_time.counts("==== 12 passed in 3.10s ====\n") == {"passed": 12}
    assert suite_time.counts("Interrupted: 1 error during collection") == {}
