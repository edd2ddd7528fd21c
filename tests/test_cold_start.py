"""``benchmarks/cold_start.py`` starts an nllab command in a new home beside an empty
installation cache, in a second new home beside it, and in that home again."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cold_start(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is a folder of scripts, not installed
    return importlib.import_module("benchmarks.cold_start")


def test_each_start_is_a_process_of_its_own_timed_in_wall_and_cpu_seconds(cold_start, capsys):
    figures = cold_start.measure(["--help"], repeats=1)
    assert list(figures) == ["cold", "new home", "warm"]
    for ((wall, cpu, trained),) in figures.values():
        assert wall > 0 and cpu > 0 and trained == 0  # the help trains no canary
    cold_start.main(["--repeats", "1", "--command=--help"])
    table = capsys.readouterr().out
    assert "| new home |" in table and "a new home" in table and "cores, load" in table


def test_a_command_that_fails_stops_the_measurement_naming_it(cold_start):
    with pytest.raises(SystemExit, match=r"nllab no-such-command failed \(2\)"):
        cold_start.measure(["no-such-command"], repeats=1)
