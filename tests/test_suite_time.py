"""``benchmarks/suite_time.py`` times what ``make test`` runs and reads pytest's own counts."""

from __future__ import annotations

import json
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


def test_modules_are_handed_out_longest_first_from_a_runs_report(tmp_path, monkeypatch):
    """``scripts/module_seconds.py`` adds a JUnit report's times up per module (a class's tests
    to their module; the largest figure of a module in several reports), and the suite's
    collection puts the modules in that order, longest first, an unrecorded one before all."""
    monkeypatch.syspath_prepend(str(ROOT))
    import conftest

    import scripts.module_seconds as durations

    report = tmp_path / "run.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.test_a" name="x" time="1.5"/>'
        '<testcase classname="tests.test_a.TestGroup" name="y" time="2.0"/>'
        '<testcase classname="tests.test_b" name="z" time="9.0"/>'
        "</testsuite></testsuites>"
    )
    assert durations.module_seconds(report) == {"tests/test_a.py": 3.5, "tests/test_b.py": 9.0}
    out = tmp_path / "module_seconds.json"
    monkeypatch.setattr(durations, "OUT", out)
    durations.main([str(report)])
    seconds = json.loads(out.read_text())
    assert list(seconds) == ["tests/test_b.py", "tests/test_a.py"]

    class Item:
        def __init__(self, name: str, test: str) -> None:
            self.path, self.test = ROOT / "tests" / name, test

    items = [Item("test_a.py", "1"), Item("test_a.py", "2"), Item("test_b.py", "3")]
    items.append(Item("test_new.py", "4"))
    monkeypatch.setattr(conftest, "_module_seconds", lambda: seconds)
    conftest._longest_first(items)
    assert [i.test for i in items] == ["4", "3", "1", "2"]
