"""How long the ledger's missing cells take here: other processors' records at this one's
speed, and ``nllab ledger status --time-left``."""

from __future__ import annotations

import json

import pytest
from cells import ledger_record

from flows.cli import main
from flows.ledger import FIXED_SECONDS, expected_seconds, speed_ratios
from tasks.ledger import append_records, hardware_name
from tasks.ledger.scope import ledger_scope, paper_config
from tasks.machine import usable_cores
from tasks.reports import measurements

RECORDS = [
    ledger_record("integro_de", "node", 0, train_seconds=500.0, hardware="EPYC"),
    ledger_record("spiral_dde", "node", 0, train_seconds=600.0, hardware="EPYC"),
    ledger_record("integro_de", "node", 0, train_seconds=1000.0, hardware="Xeon"),
    ledger_record("spiral_dde", "node", 0, train_seconds=900.0, hardware="Xeon"),
    ledger_record("spiral_dde", "node", 1, train_seconds=1100.0, hardware="Xeon"),
    ledger_record("mackey_glass_dde", "anode", 0, train_seconds=2000.0, hardware="Xeon"),
    ledger_record("integro_de", "latent_ode", 0, train_seconds=70.0, hardware="Opteron"),
    ledger_record("integro_de", "node", 0, train_seconds=5.0, hardware="EPYC", device="cuda"),
]


def test_a_processor_is_timed_against_another_on_the_cells_both_recorded():
    """EPYC took 500 of Xeon's 1000 s on integro_de and 600 of its median 1000 s on spiral_dde:
    ×0.55 (the median ratio); Opteron shares no cell with it (left out); the GPU's record is of
    another kind of device."""
    assert speed_ratios(RECORDS, "EPYC") == {"Xeon": pytest.approx(0.55)}
    assert speed_ratios(RECORDS, "Xeon") == {"EPYC": pytest.approx((1000 / 500 + 1000 / 600) / 2)}
    assert speed_ratios(RECORDS, "Opteron") == {}
    assert speed_ratios(RECORDS, None) == {}
    assert speed_ratios(RECORDS, "EPYC", "cuda") == {}


def test_another_processors_records_count_at_this_ones_speed():
    def expected(method: str, system: str, hardware: str) -> float | None:
        seconds = expected_seconds([[system]], method, "", RECORDS, "cpu", hardware)
        return None if seconds is None else seconds - FIXED_SECONDS

    assert expected("anode", "mackey_glass_dde", "EPYC") == pytest.approx(2000.0 * 0.55)
    assert expected("anode", "mackey_glass_dde", "Opteron") == 2000.0  # no ratio: as recorded
    assert expected("latent_ode", "integro_de", "EPYC") == 70.0
    assert expected("node", "integro_de", "EPYC") == 500.0  # its own records, unscaled


TINY = """\
max_workers = 1
[data]
n_trajectories = 30
[training]
epochs = 2
"""


def test_time_left_lists_the_groups_run_trains_with_their_estimates(tmp_path, capsys, monkeypatch):
    """node's seed 0 is recorded (100 s on integro_de, 300 s on spiral_dde, another
    processor's records): its seed 1 trains as two packs (one per system: their shapes differ)
    on the config's one worker, 400 s and the fixed cost; anode has no record and no projection
    of its column, so its groups have no estimate; anode's seed 0 comes first (`ledger run`
    gives each column a seed first)."""
    monkeypatch.setattr(measurements, "FOLDER", tmp_path / "no measurements")
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    systems, methods = ["integro_de", "spiral_dde"], ["node", "anode"]
    scope = ledger_scope(config, systems, methods)
    ledger = tmp_path / "ledger.jsonl"
    took = {"integro_de": 100.0, "spiral_dde": 300.0}
    recorded = [
        ledger_record(c.system, "node", 0, config_hash=c.config_hash, train_seconds=took[c.system])
        for c in scope.select(methods=["node"], seeds=[0])
    ]
    append_records(ledger, recorded)
    assert hardware_name("cpu") != "some CPU"  # the records are another processor's
    selection = ["--systems", *systems, "--methods", *methods, "--seeds", "0", "1"]
    base = ["ledger", "status", "--ledger", str(ledger), "--config", str(config), "--no-ablation"]
    assert main([*base, *selection, "--time-left"]) == 0
    out = capsys.readouterr().out.split("Time left: ", 1)[1].splitlines()
    assert out[0].startswith(
        f"6 missing cells in 3 groups, as `ledger run` trains them here one group after another "
        f"({hardware_name('cpu')}, {min(1, usable_cores())} at once): about 7 min (and 2 groups "
        "without an estimate)"
    )
    rows = [line.split() for line in out[1:]]
    assert [r[:3] for r in rows] == [
        ["anode", "seed", "0,"],
        ["node", "seed", "1,"],
        ["anode", "seed", "1,"],
    ]
    assert " ".join(rows[1][5:]) == "about 7 min (other processors' records)"
    assert round((FIXED_SECONDS + 400) / 60) == 7
    # node's seed 1 on spiral_dde kept after its first of 2 epochs (a run stopped mid-way): a
    # quarter of the group's epochs trained, so three quarters of its training time left
    kept = tmp_path / "checkpoints"
    kept.mkdir()
    (cell,) = scope.select(methods=["node"], seeds=[1], systems=["spiral_dde"])
    meta = {"format": 1, "labels": ["spiral_dde/node/seed1"], "epoch": 0, "finished": False}
    meta["identities"] = [f"{cell.config_hash} fingerprints cpu"]
    (kept / "run.json").write_text(json.dumps(meta))
    (kept / "run.pt").write_bytes(b"")
    assert main([*base, *selection, "--time-left"]) == 0
    out = capsys.readouterr().out.split("Time left: ", 1)[1].splitlines()
    left = FIXED_SECONDS + 400 * 0.75
    assert out[2].split("about", 1)[1].split() == [
        f"{round(left / 60)}", "min", "(other", "processors'", "records;", "25%", "of", "its",
        "epochs", "trained", "by", "kept", "runs,", "resumed)",
    ]  # fmt: skip
    meta["identities"] = ["0123abcd fingerprints cpu"]  # another config's run: not resumed
    (kept / "run.json").write_text(json.dumps(meta))
    assert main([*base, *selection, "--time-left"]) == 0
    assert "kept runs" not in capsys.readouterr().out
    assert "no record of the method on the CPU" in " ".join(rows[0])
    # no record of the selected method: not guessed
    assert main([*base, *selection[:3], "--methods", "anode", "--time-left"]) == 0
    assert "at once): not known: the ledger has no record" in capsys.readouterr().out
    # nothing missing: said so
    done = ["--systems", "integro_de", "--methods", "node", "--seeds", "0"]
    assert main([*base, *done, "--time-left"]) == 0
    assert "Time left: none, every selected cell is recorded" in capsys.readouterr().out


def test_records_of_the_cells_own_settings_come_before_the_methods_other_records():
    """node under two protocols: its ``alike`` records (2000 s on spiral_dde) serve spiral_dde
    and, for want of its own, integro_de too, over the other protocol's 500 s there; a method
    with no alike record at all is expected from its records as before."""
    records = [
        ledger_record("integro_de", "node", 0, config_hash="fair-i0", train_seconds=500.0),
        ledger_record("spiral_dde", "node", 0, config_hash="fair-s0", train_seconds=400.0),
        ledger_record("spiral_dde", "node", 0, config_hash="ref-s0", train_seconds=2000.0),
        ledger_record("spiral_dde", "node", 1, config_hash="ref-s1", train_seconds=2200.0),
    ]

    def expected(system: str, alike: set[str]) -> float | None:
        seconds = expected_seconds([[system]], "node", "", records, "cpu", "x", alike=alike)
        return None if seconds is None else seconds - FIXED_SECONDS

    reference, fair = {"ref-s0", "ref-s1"}, {"fair-i0", "fair-s0"}
    assert expected("spiral_dde", reference) == pytest.approx(2100.0)
    assert expected("integro_de", reference) == pytest.approx(2100.0)
    assert expected("spiral_dde", fair) == pytest.approx(400.0)
    assert expected("integro_de", fair) == pytest.approx(500.0)
    assert expected("integro_de", set()) == pytest.approx(500.0)  # (its system's records)


def test_a_reference_protocol_cell_is_expected_from_the_reference_protocols_records():
    """The paper profile's node (the reference code's adjoint) and the fair profile's keep
    records of one system side by side; each profile's missing seed is expected from its own
    profile's records, found by their config hashes (:func:`flows.ledger.plan.same_settings`)."""
    from flows.ledger.groups import LedgerGroup
    from flows.ledger.plan import group_config, recorded_seconds, same_settings
    from tasks.ledger import paper_config

    system, here = "integro_de", hardware_name("cpu")
    took = {"paper": 7000.0, "fair": 1500.0}
    seed0 = {
        p: paper_config(profile=p, systems=[system], methods=["node"]).cells()[0] for p in took
    }
    records = [
        ledger_record(
            system, "node", 0, config_hash=seed0[p].config_hash(), train_seconds=t, hardware=here
        )
        for p, t in took.items()
    ]
    group = LedgerGroup("node", "", (1,), (system,))
    for profile, seconds in took.items():
        config = group_config(group, {"profile": profile}, {"device": "cpu"})
        assert same_settings(config, records) & {r.config_hash for r in records} == {
            records[list(took).index(profile)].config_hash
        }
        assert recorded_seconds(group, config, records) == pytest.approx(FIXED_SECONDS + seconds)


def test_a_cell_is_expected_from_the_newest_records_of_its_kind():
    """Eight records of one cell's settings, the older slower (code since made faster): the
    estimate is the median of the newest :data:`RECENT_RECORDS`, here and from another
    processor alike; with fewer records, all of them."""
    from flows.ledger import RECENT_RECORDS

    took = [6000.0, 6100.0, 5900.0, 2000.0, 2100.0, 1900.0, 2050.0, 1950.0]
    assert RECENT_RECORDS == 5 and len(took) > RECENT_RECORDS
    for hardware in ("x", "elsewhere"):
        records = [
            ledger_record("integro_de", "node", k, train_seconds=t, hardware=hardware)
            for k, t in enumerate(took)
        ]
        seconds = expected_seconds([["integro_de"]], "node", "", records, "cpu", "x")
        assert seconds == pytest.approx(FIXED_SECONDS + 2000.0)  # the newest 5: 2000 … 1950
        few = expected_seconds([["integro_de"]], "node", "", records[:3], "cpu", "x")
        assert few == pytest.approx(FIXED_SECONDS + 6000.0)


def test_a_record_trained_under_load_counts_its_cpu_seconds_not_its_wall_time():
    """Two processors' records of the same cells, one of them made while other work held the
    machine (its wall time thrice its CPU time): the estimate and the processors' ratio are
    those of the time the runs themselves took, as if the machine had been quiet."""
    quiet = ledger_record("integro_de", "node", 0, train_seconds=1000.0, hardware="x")
    loaded = ledger_record(
        "integro_de", "node", 1, train_seconds=3000.0, train_cpu_seconds=1000.0, hardware="x"
    )
    elsewhere = ledger_record("integro_de", "node", 0, train_seconds=500.0, hardware="y")
    seconds = expected_seconds([["integro_de"]], "node", "", [quiet, loaded], "cpu", "x")
    assert seconds == pytest.approx(FIXED_SECONDS + 1000.0)  # the wall times' median: 2000
    assert speed_ratios([loaded, elsewhere], "x") == {"y": pytest.approx(2.0)}  # not ×6
    on_y = expected_seconds([["integro_de"]], "node", "", [loaded, elsewhere], "cpu", "y")
    assert on_y == pytest.approx(FIXED_SECONDS + 500.0)


def test_a_method_without_records_is_expected_from_the_projection_of_its_column(
    tmp_path, capsys, monkeypatch
):
    """No record of anode: its groups are expected from the committed projection of its column
    (``benchmarks/ledger_projection.py``: CPU hours for 5 seeds × 6 systems at the paper's 1000
    epochs), scaled to the cells' training (trajectories × epochs) and to this processor's
    speed where the ledger relates the two processors, and the line says what it rests on."""
    from flows.ledger import projected_cell_seconds
    from flows.ledger.plan import training_work

    folder = tmp_path / "measurements"
    monkeypatch.setattr(measurements, "FOLDER", folder)
    assert projected_cell_seconds("anode") is None  # no record: no projection
    columns = ["method", "packs of seed 0 (members: s/epoch)", "CPU h per column"]
    rows = [["anode", "1 one by one: 1.00", "30000"], ["node", "1 one by one: 1.00", "3.0"]]
    machine = "Zen 9, 2 cores, load 0.0"
    path = measurements.record_measurement(
        "ledger_projection", "t", "c", columns, rows, folder=folder, machine=machine
    )
    assert projected_cell_seconds("anode") == (30000 * 3600 / 30, "Zen 9")
    assert projected_cell_seconds("anode", path) == (3.6e6, "Zen 9")
    assert projected_cell_seconds("lno") is None  # not in the projection
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    systems = ["integro_de", "spiral_dde"]
    ledger = tmp_path / "ledger.jsonl"
    base = ["ledger", "status", "--ledger", str(ledger), "--config", str(config), "--no-ablation"]
    selection = ["--systems", *systems, "--methods", "anode", "--seeds", "0"]
    assert main([*base, *selection, "--time-left"]) == 0
    out = capsys.readouterr().out.split("Time left: ", 1)[1].splitlines()
    tiny = paper_config(config_file=config, systems=systems, methods=["anode"])
    paper = paper_config(systems=systems, methods=["anode"])
    work = sum(training_work(tiny, s) / training_work(paper, s) for s in systems)
    assert 0 < work < 0.01  # the tiny profile trains far less than the paper's
    seconds = FIXED_SECONDS + 3.6e6 * work  # two packs, one worker: one after the other
    assert out[0].endswith(
        f"about {round(seconds / 60)} min, by the ledger's records (1 group by the projection "
        "of its column)"
    )
    assert out[1].split("about", 1)[1].split() == [
        f"{round(seconds / 60)}", "min", "(no", "record", "yet:", "the", "projection", "of",
        "its", "column", "on", "Zen", "9,", "training", "epochs", "only)",
    ]  # fmt: skip
    # Zen 9 took half this processor's time on a cell both recorded (any seed): counted at ×2
    here, there = hardware_name("cpu"), "Zen 9"
    append_records(
        ledger,
        [
            ledger_record("stiff_van_der_pol", "node", seed, train_seconds=t, hardware=h)
            for seed, t, h in ((0, 200.0, here), (1, 100.0, there))
        ],
    )
    assert main([*base, *selection, "--time-left"]) == 0
    out = capsys.readouterr().out.split("Time left: ", 1)[1].splitlines()
    assert "(Zen 9's records count at ×2.00" in out[1]
    doubled = FIXED_SECONDS + 2 * 3.6e6 * work
    assert out[2].split("about", 1)[1].split()[0] == f"{round(doubled / 60)}"


def test_a_cell_an_earlier_group_trains_is_not_counted_again(tmp_path, monkeypatch):
    """The NFE figure's dopri5 NODE cell of piecewise forcing is the solvers study's dopri5
    cell (one config), measured from the run that group makes (``ledger run``'s measured
    twins): its group expects only a benchmark's fixed cost, not a second training. The solvers
    study's Euler cell is Table 3's (the same config, nothing more to measure): left to Table
    3's group, no group of its own."""
    import flows.ledger.forecast as forecast_module
    import flows.ledger.plan as plan
    from flows.ledger.forecast import forecast
    from tasks.ledger import LedgerCell, cell_states

    system, variant = (
        "piecewise_forcing_ode",
        'model.atol=1e-09; model.rtol=1e-07; model.solver="dopri5"',
    )
    euler = paper_config(systems=[system], methods=["node"], seeds=[0]).cells()[0]
    ehash, dhash = euler.config_hash(), "d" * 64
    cells = [
        LedgerCell(system, "node", 0, ehash, "today"),
        LedgerCell(system, "node", 0, ehash, "today", "", "solvers"),
        LedgerCell(system, "node", 0, dhash, "today", variant, "solvers"),
        LedgerCell(system, "node", 0, dhash, "today", variant, "nfe", "nfe_horizon"),
    ]
    ledger = tmp_path / "ledger.jsonl"
    here = hardware_name("cpu")
    append_records(
        ledger,
        [ledger_record(system, "node", 1, config_hash=ehash, train_seconds=1000.0, hardware=here)],
    )
    monkeypatch.setattr(
        forecast_module, "ledger_states", lambda path, selection: cell_states([], cells)
    )
    monkeypatch.setattr(plan, "solver_factors", lambda: {("node", "dopri5"): 10.0})
    got = forecast(ledger, selection={"profile": "paper"}, execution={"max_workers": 1})
    rows = [(g.group.study, g.group.ablation, g.twins, g.seconds) for g in got.groups]
    assert rows == [
        ("", "", 0.0, pytest.approx(FIXED_SECONDS + 1000.0)),
        ("solvers", variant, 0.0, pytest.approx(FIXED_SECONDS + 10000.0)),
        ("nfe", variant, 1.0, FIXED_SECONDS),
    ]


def test_a_projection_without_its_columns_is_named_with_the_command_that_writes_it(tmp_path):
    from flows.ledger import projected_cell_seconds, solver_factors

    columns = ["method", "CPU hours"]
    path = measurements.record_measurement(
        "ledger_projection", "t", "python make_it.py", columns, [["anode", "3"]], folder=tmp_path
    )
    with pytest.raises(ValueError, match=r"no column 'CPU h per column'.*python make_it\.py"):
        projected_cell_seconds("anode", path)
    columns = ["method", "CPU h per column"]
    path = measurements.record_measurement(
        "ledger_projection",
        "t",
        "python make_it.py",
        columns,
        [["anode", "?"]],
        folder=tmp_path / "b",
    )
    with pytest.raises(ValueError, match=r"holds '\?' where a number belongs"):
        projected_cell_seconds("anode", path)
    path = measurements.record_measurement(
        "wallclock", "t", "c", ["method", "value"], [["node", "2"]], folder=tmp_path
    )
    with pytest.raises(ValueError, match="no column 'solver'"):
        solver_factors(path)


def test_time_left_sums_each_table_where_the_groups_belong_to_several():
    """``--time-left`` over several tables gives each table's time (its groups' sum) in the
    order its first group trains, with its groups that have no estimate; over one table, none."""
    from flows.ledger import Forecast, LedgerGroup, forecast_text
    from flows.ledger.forecast import GroupForecast

    def group(method: str, seconds: float | None, study: str = "", ablation: str = ""):
        g = LedgerGroup(method, ablation, (0,), ("integro_de",), study)
        return GroupForecast(g, seconds, True)

    groups = (
        group("node", 3600.0),
        group("node", 600.0, "cmi"),
        group("lno", None),
        group("anode", 1800.0),
        group("anode", None),
        group("anode", 60.0, "cmi"),
        group("neural_laplace", 120.0, ablation="stereographic_off"),
    )
    text = forecast_text(Forecast(groups, "CPU", 1, {})).splitlines()
    at = text.index("  Per table (its groups below, summed):")
    summary = [" ".join(line.split()) for line in text[at + 1 : at + 5]]
    assert summary == [
        "Table 3 about 1 h 30 min (and 1 group without an estimate)",
        "cmi about 11 min",
        "the Laplace-domain peers (not Table 3's) not known (1 group without an estimate)",
        "the stereographic ablation (Table 5) about 2 min",
    ]
    assert text[at + 5].split()[:3] == ["node", "seed", "0,"]  # then the groups
    one = forecast_text(Forecast(groups[:1] + groups[3:4], "CPU", 1, {}))
    assert "Per table" not in one


def test_run_says_how_many_of_its_cells_it_recorded_and_the_twins_apart(
    tmp_path, capsys, monkeypatch
):
    """``ledger run``'s last line counts the cells it was to train apart from the study cells
    it measured from their runs (not "4 of 3")."""
    import flows.ledger as ledger_face
    from flows.ledger import LedgerRun

    records = [ledger_record("integro_de", "node", seed) for seed in range(4)]
    done = LedgerRun(todo=3, appended=records, twins=1)
    monkeypatch.setattr(ledger_face, "run_ledger", lambda *a, **k: done)
    ledger = tmp_path / "ledger.jsonl"
    args = ["ledger", "run", "--ledger", str(ledger), "--nice", "0", "--no-ablation"]
    assert main([*args, "--methods", "node", "--systems", "integro_de"]) == 0
    out = capsys.readouterr().out
    assert f"ledger: 3 of 3 cells to train recorded in {ledger}, with 1 study cell measured" in out
    done.appended, done.twins = records[:3], 0
    assert main([*args, "--methods", "node", "--systems", "integro_de"]) == 0
    assert f"ledger: 3 of 3 cells to train recorded in {ledger}\n" in capsys.readouterr().out
