"""Comparing benchmarks: one verdict rule (rounding is no change; a regression is beyond the seeds'
spread and a relative tolerance), and defaults that find the right runs: the latest benchmark
with results beside the earlier one of the same cells and profile, even when older code tagged
another experiment hash; ``report`` passes over a benchmark whose every cell failed. Stores are
made of hand-written parent runs and ``cells.json`` records (no training)."""

from __future__ import annotations

import json
import time

import pytest

from flows.cli import main
from flows.reports.compare import CELLS_ARTIFACT, cells_hash, compare_benchmarks
from tasks.reports.comparison import ROUNDING, judge
from tasks.tracking import RunTags, connect


@pytest.mark.parametrize(
    ("before", "after", "spread", "rtol", "expected"),
    [
        (0.3, 0.3 + 8.327e-17, 0.0, 0.05, "unchanged"),  # a reduction summed in another order
        (0.3, 0.3 * (1 + ROUNDING / 2), 0.0, 0.0, "unchanged"),
        (0.3, 0.3 * (1 + 2 * ROUNDING), 0.0, 0.0, "regressed"),
        (0.1, 0.103, 0.0, 0.05, "within tolerance"),  # 3 %: within the relative tolerance
        (0.1, 0.103, 0.0, 0.01, "regressed"),
        (0.1, 0.097, 0.0, 0.01, "improved"),
        (0.1, 0.12, 0.025, 0.05, "within tolerance"),  # 20 %, within the seeds' spread
        (0.1, 0.13, 0.025, 0.05, "regressed"),
        (0.1, None, 0.0, 0.05, "regressed"),  # failed now
        (None, 0.1, 0.0, 0.05, "improved"),  # failed before
        (None, None, 0.0, 0.05, "unchanged"),
    ],
)
def test_one_rule_judges_every_change(before, after, spread, rtol, expected):
    assert judge(before, after, spread, rtol) == expected


def _benchmark(tracker, profile: str, cells: list[dict], *, experiment: str, tagged: bool = True):
    """A finished benchmark parent run holding ``cells`` (``cells_hash`` tagged, or not: a run of
    older code); cell counts as ``record_cells`` tags them."""
    ok = sum(c["status"] in ("finished", "reused") for c in cells)
    tags = {
        RunTags.KIND: "benchmark",
        RunTags.PROFILE: profile,
        RunTags.EXPERIMENT_HASH: experiment,
        RunTags.CELLS: str(len(cells)),
        RunTags.CELLS_FINISHED: str(ok),
        RunTags.CELLS_REUSED: "0",
        RunTags.CELLS_FAILED: str(len(cells) - ok),
    }
    if tagged:
        tags[RunTags.CELLS_HASH] = cells_hash(c["config_hash"] for c in cells)
    time.sleep(0.005)  # start times in milliseconds: each run after the one before
    with tracker.runs.run(f"benchmark-{profile}", tags) as run_id:
        tracker.runs.log_text(run_id, json.dumps(cells), CELLS_ARTIFACT)
    return run_id


#: One seed per method: no seeds' spread, the relative tolerance alone judges a change.
METHODS = ("node", "anode", "neural_laplace")


def _cells(values, status="finished", tag="x") -> list[dict]:
    return [
        {
            "system": "integro_de",
            "method": METHODS[seed],
            "seed": seed,
            "status": status,
            "test_rmse": value,
            "run_id": f"{tag}{seed}",
            "config_hash": f"h{seed}",
        }
        for seed, value in enumerate(values)
    ]


def test_compare_finds_the_earlier_benchmark_of_the_same_cells_and_judges_rounding_unchanged(
    mlflow_store, capsys
):
    tracker = connect()
    # older code: another experiment hash, no cells_hash tag; its cells are the same
    old = _benchmark(
        tracker, "smoke", _cells([0.3, 0.2, 0.1], tag="a"), experiment="e-old", tagged=False
    )
    _benchmark(tracker, "quick", _cells([9.0, 9.0, 9.0], tag="q"), experiment="e-new")  # profile
    new = _benchmark(
        tracker, "smoke", _cells([0.3 + 8.327e-17, 0.2, 0.103], tag="b"), experiment="e-new"
    )
    _benchmark(tracker, "smoke", _cells([None] * 3, status="failed", tag="f"), experiment="e-new")

    comparison = compare_benchmarks(tracker.queries)
    assert (comparison.after_run, comparison.before_run) == (new, old)
    assert [c.verdict for c in comparison.cells] == ["unchanged", "unchanged", "within tolerance"]

    assert main(["compare"]) == 0
    out = capsys.readouterr().out
    assert f"benchmark {new} " in out and f"({old}, " in out and "profile smoke" in out
    assert "2 unchanged, 1 within tolerance, 0 regressed" in out
    # a stated tolerance of 1 %: the 3 % change is a regression, exit 1
    assert main(["compare", "--rtol", "0.01"]) == 1
    assert "1 cell regressed" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:  # argparse: usage errors exit 2
        main(["compare", "--rtol", "-1"])
    assert usage.value.code == 2
    assert "--rtol: expected a finite number >= 0" in capsys.readouterr().err


def test_compare_says_which_benchmark_has_nothing_before_it(mlflow_store, capsys):
    tracker = connect()
    only = _benchmark(tracker, "smoke", _cells([0.3]), experiment="e")
    _benchmark(tracker, "smoke", _cells([None], status="failed"), experiment="e")
    assert main(["compare"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nothing to compare: no earlier finished benchmark of the same cells")
    assert f"as {only} (profile smoke, " in out and " UTC, 1 of 1 cells with results)" in out


def _records_of(config) -> list[dict]:
    """The ``cells.json`` records of every cell of ``config``, each finished at 0.3."""
    return [
        {**c, "config_hash": cell.config_hash(), "method": cell.method, "seed": cell.seed}
        for c, cell in zip(_cells([0.3] * len(config.cells())), config.cells(), strict=True)
    ]


def _cell_runs(tracker, config, parent: str) -> None:
    """A finished cell run of each cell of ``config`` under benchmark run ``parent``."""
    for cell in config.cells():
        tags = {RunTags.KIND: "cell", RunTags.CONFIG_HASH: cell.config_hash()}
        with tracker.runs.run("cell", tags, parent) as run_id:
            tracker.runs.log_metrics(run_id, {"test_rmse": 0.3})


def test_report_defaults_to_the_latest_benchmark_with_results(mlflow_store, tmp_path, capsys):
    from flows.reports.report_full import benchmark_config
    from tasks.config import resolve_config

    tracker = connect()
    config = resolve_config("smoke", None, {"systems": ["integro_de"], "methods": ["node"]})
    cells = _records_of(config)
    done = _benchmark(tracker, "smoke", cells, experiment="e")
    tracker.runs.log_text(done, config.model_dump_json(), "run_config.json")
    _cell_runs(tracker, config, done)
    failed = [{**c, "status": "failed", "test_rmse": None} for c in cells]
    all_failed = _benchmark(tracker, "smoke", failed, experiment="e")
    tracker.runs.log_text(all_failed, config.model_dump_json(), "run_config.json")

    assert benchmark_config(tracker.queries) == (config, done)
    assert main(["report", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"reporting the latest benchmark with results:\n  {done} (profile smoke, " in out
    assert f"{len(cells)} of {len(cells)} cells have finished runs" in out


def test_report_speaks_of_the_benchmark_of_its_cells_not_a_later_one_of_another_profile(
    mlflow_store, tmp_path, capsys
):
    """A quick benchmark trained its cells (a second, all-reused invocation made no new parent);
    a smoke benchmark ran since. The report of the quick cells says the quick benchmark trained
    them, and compares it with the quick benchmark before it, not with the smoke one."""
    from tasks.config import resolve_config

    tracker = connect()
    config = resolve_config("quick", None, {"systems": ["integro_de"], "methods": ["node"]})
    cells = _records_of(config)
    earlier = _benchmark(tracker, "quick", cells, experiment="e")
    trained = _benchmark(tracker, "quick", cells, experiment="e")
    _cell_runs(tracker, config, trained)
    smoke = _benchmark(tracker, "smoke", _cells([0.1], tag="s"), experiment="e-smoke")

    argv = ["report", "--profile", "quick", "--systems", "integro_de", "--methods", "node"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    n = len(cells)
    assert (
        f"{n} of {n} cells have finished runs: {n} trained by benchmark {trained}, 0 reused" in out
    )
    since = out[out.index("## Since the previous benchmark") :]
    assert f"benchmark {trained} " in since and f"({earlier}, " in since and smoke not in since


def test_a_clock_gone_back_is_said_where_runs_are_ordered_by_start_time():
    """A run that started later than now: the clock went back since, and the latest or the
    earlier benchmark by start time may not be the one made last or before."""
    from flows.reports.compare import clock_went_back
    from tasks.tracking import StoredRun

    now = 1_800_000_000.0
    day = 86_400_000
    earlier = StoredRun("a" * 32, "FINISHED", int(now * 1000) - day, {"profile": "quick"})
    ahead = StoredRun("b" * 32, "FINISHED", int(now * 1000) + day, {"profile": "quick"})
    assert clock_went_back([earlier], now) is None
    line = clock_went_back([ahead, earlier], now)
    assert line is not None and "the clock went back: 1 benchmark run started later" in line
    assert "b" * 32 in line and "nllab compare --run RUN --against RUN" in line
