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


def test_the_suite_runs_in_the_environment_make_gives_its_recipes(
    suite_time, tmp_path, monkeypatch
):
    makefile = tmp_path / "Makefile"
    makefile.write_text("VENV ?= .venv\nunexport NLLAB_A NLLAB_B\n\ntest: $(STAMP)\n")
    for name in ("NLLAB_A", "NLLAB_B", "NLLAB_C"):
        monkeypatch.setenv(name, "1")
    env = suite_time.make_environment(makefile)
    assert "NLLAB_A" not in env and "NLLAB_B" not in env and env["NLLAB_C"] == "1"
    # the repository's: Python keeps its compiled modules, whatever this environment says
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert "PYTHONDONTWRITEBYTECODE" not in suite_time.make_environment()


def test_counts_are_pytests_last_line(suite_time):
    last = "3 failed, 1033 passed, 3 skipped, 70 deselected, 2 warnings, 2 errors in 9.28s"
    assert suite_time.counts(last) == {
        "failed": 3, "passed": 1033, "skipped": 3, "deselected": 70, "errors": 2
    }  # fmt: skip
    assert suite_time.counts("==== 12 passed in 3.10s ====\n") == {"passed": 12}
    assert suite_time.counts("Interrupted: 1 error during collection") == {}


def test_a_record_keeps_the_newest_timed_runs_first(suite_time, tmp_path):
    from tasks.reports.measurements import read_measurement, record_measurement

    record = tmp_path / "suite_time.json"
    assert suite_time.with_history(("new",) * 6, record) == [("new",) * 6]  # no record yet
    old = ("`pytest`", "6 min 1 s (361 s)", "1047 passed", "3.6", "2.0")  # before the commit column
    record_measurement("suite_time", "t", "c", suite_time.COLUMNS[:5], [old], "", tmp_path)
    commit = read_measurement(record).commit
    assert suite_time.with_history(("new",) * 6, record) == [("new",) * 6, (*old, commit)]
    many = [(str(i),) * 6 for i in range(suite_time.KEEP)]
    record_measurement("suite_time", "t", "c", suite_time.COLUMNS, many, "", tmp_path)
    kept = suite_time.with_history(("new",) * 6, record)
    assert kept == [("new",) * 6, *many[: suite_time.KEEP - 1]]


def test_a_failed_suite_is_timed_but_never_recorded(suite_time, monkeypatch, tmp_path, capsys):
    """A run that did not pass (exit code 1: a test failed) prints its time and is kept out of
    the record, which says how long the passing suite takes; a passing run is recorded."""
    recorded: list[tuple] = []
    monkeypatch.setattr(suite_time, "RECORD", tmp_path / "suite_time.json")
    import tasks.reports.measurements as measurements

    monkeypatch.setattr(
        measurements, "record_measurement", lambda *a, **k: recorded.append(a) or tmp_path
    )
    last = "1 failed, 1637 passed, 5 skipped, 2 warnings in 812.09s (0:13:32)\n"
    monkeypatch.setattr(suite_time, "run_suite", lambda command, env: (812.0, 1, last))
    assert suite_time.main(["--record"]) == 1
    out = capsys.readouterr()
    assert "tests: 1 failed, 1637 passed, 5 skipped" in out.out
    assert "not recorded: the suite did not pass (exit code 1)" in out.err
    assert recorded == []
    passed = "1638 passed, 5 skipped in 825.58s (0:13:45)\n"
    monkeypatch.setattr(suite_time, "run_suite", lambda command, env: (836.0, 0, passed))
    assert suite_time.main(["--record"]) == 0
    (args,) = recorded
    assert args[4][0][1:3] == ("13 min 56 s (836 s)", "1638 passed, 5 skipped")
