"""Reuse by numerics: a stored cell is reused only when today's code computes its numbers as the
code that trained it did. A plugin model's source file is edited between benchmarks: a change of
its arithmetic retrains its cells only (and ``nllab compare`` names them), a refactor that keeps
its numbers reuses every cell, ``--reuse config`` reuses whatever trained them; the nightly
schedule records each night's comparison as Prefect artifacts."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flows.benchmark import run_benchmark
from flows.cli import main
from nlmodels import MODELS
from nltrain.numerics import _fingerprints as numerics
from tasks.cell import stored_results
from tasks.config import RunConfig
from tasks.machine.numerics import cell_fingerprints, model_key
from tasks.tracking import RunTags, connect

ROOT = Path(__file__).resolve().parents[1]
TOY = "toy_offset"

# The toy model predicts an affine map of the last observation and the query time, plus a fixed
# OFFSET that training cannot move in two epochs: OFFSET is "the model's arithmetic".
SOURCE = """
import torch
from torch import nn

from nlmodels import ForecastModel, register_model

OFFSET = {offset}


@register_model("toy_offset")
class ToyOffset(ForecastModel):
    def __init__(self, state_dim: int, width: int = 1) -> None:
        super().__init__()
        self.state_dim = state_dim
        self.net = nn.Linear(state_dim + width, state_dim)

    def forward(self, obs_t, obs_x, query_t):
        self.count_nfe()
        {body}
"""
BODY = """q = query_t if query_t.dim() == 2 else query_t.expand(obs_x.shape[0], -1)
        last = obs_x[:, -1:, :].expand(-1, q.shape[1], -1)
        return self.net(torch.cat([last, q.unsqueeze(-1)], -1)) + OFFSET"""
# the same numbers, the code moved into a helper and renamed
REFACTORED = """return _shifted(self.net, obs_x, query_t)


def _times(query_t, n):
    # one grid per trajectory
    return query_t if query_t.dim() == 2 else query_t.expand(n, -1)


def _shifted(layer, observed, query_t):
    times = _times(query_t, observed.shape[0])
    held = observed[:, -1:, :].expand(-1, times.shape[1], -1)
    return layer(torch.cat([held, times.unsqueeze(-1)], -1)) + OFFSET"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """``write(offset, body)``: (re)write and (re)import the toy model's module."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(offset: float, body: str = BODY) -> None:
        module = tmp_path / "toy_numerics.py"
        module.write_text(textwrap.dedent(SOURCE).format(offset=offset, body=body))
        # Python's bytecode cache knows a source by its size and whole-second time: one
        # rewritten within the second at the same size (0.0 -> 5.0) would import as it was
        Path(importlib.util.cache_from_source(str(module))).unlink(missing_ok=True)
        MODELS.pop(TOY, None)
        importlib.invalidate_caches()
        if "toy_numerics" in sys.modules:
            importlib.reload(sys.modules["toy_numerics"])
        else:
            importlib.import_module("toy_numerics")

    yield write
    MODELS.pop(TOY, None)
    sys.modules.pop("toy_numerics", None)


def _config(**kw) -> RunConfig:
    return RunConfig.model_validate(
        {
            "profile": "smoke",
            "systems": ["integro_de"],
            "methods": [TOY, "node"],
            "seeds": [0, 1],
            "data": {"n_trajectories": 24, "n_points": 30},
            "training": {"epochs": 2, "batch_size": 8, "patience": None},
            "max_workers": 1,
            "isolation": "thread",
            "progress": False,
            "tracking": {"register_models": False},
            **kw,
        }
    )


def _statuses(summary) -> dict[str, str]:
    return {f"{r.method}/{r.seed}": r.status for r in summary.results}


def test_numerics_decide_reuse_and_compare_names_the_change(
    toy, mlflow_store, prefect_server, capsys, tmp_path
):
    toy(0.0)
    config = _config()
    first = run_benchmark(config)
    assert set(_statuses(first).values()) == {"finished"}
    tracker = connect()
    run = tracker.queries.get_run_data(first.results[0].run_id).tags
    # integro_de is 1-D: the model's fingerprint is its 1-D canary's
    one_d = numerics.model_fingerprint(first.results[0].method, None, 1)
    assert run[RunTags.NUMERICS_MODEL] == one_d != numerics.model_fingerprint(TOY)
    # its data are made on 30 points: the system canary's are too
    on_30 = numerics.system_fingerprint("integro_de", {"n_points": 30})
    assert run[RunTags.NUMERICS_SYSTEM] == on_30
    assert run[RunTags.NUMERICS_SYSTEM] != numerics.system_fingerprint("integro_de")
    before = numerics.model_fingerprint(TOY)

    # a refactor: the source (and so the cache key) changes, the numbers do not: all reused
    key = numerics.source_key(TOY)
    toy(0.0, REFACTORED)
    assert numerics.source_key(TOY) != key
    assert numerics.model_fingerprint(TOY) == before
    again = run_benchmark(config)
    assert set(_statuses(again).values()) == {"reused"}

    # the arithmetic changes: only the toy's cells are retrained (config reuse would keep them)
    toy(5.0, REFACTORED)
    assert numerics.model_fingerprint(TOY) != before
    cells = config.cells()
    assert len(stored_results(tracker.queries, cells, "config")[0]) == 4
    assert stored_results(tracker.queries, cells, "never")[1] == cells
    capsys.readouterr()
    changed = run_benchmark(config)
    assert _statuses(changed) == {
        f"{TOY}/0": "finished",
        f"{TOY}/1": "finished",
        "node/0": "reused",
        "node/1": "reused",
    }
    err = capsys.readouterr().err
    assert f"{TOY} changed since commit" in err and "2 cells retrained" in err
    assert "node changed" not in err

    # compare: the latest benchmark beside the first; an offset of 5 is a regression
    assert main(["compare"]) == 1
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if "integro_de/" in ln}
    for seed in (0, 1):
        assert "regressed" in lines[f"integro_de/{TOY}/seed{seed}"]
        assert "model" in lines[f"integro_de/{TOY}/seed{seed}"]
        assert "unchanged" in lines[f"integro_de/node/seed{seed}"]
    # compared the other way round, the same cells improved: nothing regressed, exit 0
    assert main(["compare", "--run", first.parent_run_id, "--against", changed.parent_run_id]) == 0
    assert main(["compare", "--run", "nope"]) == 2
    assert "nope is not a finished benchmark run" in capsys.readouterr().err
    # nllab report: a section with the changed cells only
    assert main(["report", "--out", str(tmp_path / "report")]) == 0
    section = capsys.readouterr().out.split("## Since the previous benchmark")[1]
    assert f"integro_de/{TOY}/seed0" in section and "regressed" in section
    assert "node/seed0" not in section


# the toy at width 2 reads the query time twice and adds OFFSET: arithmetic only that setting
# reaches (at its default, width 1, OFFSET is multiplied by 0)
WIDE = """q = query_t if query_t.dim() == 2 else query_t.expand(obs_x.shape[0], -1)
        last = obs_x[:, -1:, :].expand(-1, q.shape[1], -1)
        extra = self.net.in_features - self.state_dim
        times = q.unsqueeze(-1).expand(-1, -1, extra)
        return self.net(torch.cat([last, times], -1)) + OFFSET * (extra - 1)"""


def test_a_setting_s_own_arithmetic_moves_its_fingerprint_and_retrains_its_cells(
    toy, mlflow_store, prefect_server, capsys
):
    """A model's fingerprint is its canary built as the cell builds it: a setting that takes
    its own code path (the paper profile's linear time functions, the ablation's plain output
    map) gets a fingerprint of its own, which an edit of that path alone changes, and the
    cells of that setting are then retrained while the default's stay as they are."""
    toy(0.0, WIDE)
    config = _config(methods=[TOY], seeds=[0], models={TOY: {"width": 2}})
    (cell,) = config.cells()
    dim = model_key(cell)[2]
    default, wide = (numerics.model_fingerprint(TOY, s, dim) for s in (None, {"width": 2}))
    assert wide != default
    assert numerics.model_fingerprint(TOY, {"width": 1}, dim) == default  # a default spelt out
    assert numerics.model_settings(TOY, {"width": 1}) == {}
    first = run_benchmark(config)
    assert set(_statuses(first).values()) == {"finished"}
    tags = connect().queries.get_run_data(first.results[0].run_id).tags
    assert tags[RunTags.NUMERICS_MODEL] == cell_fingerprints(cell)[0] == wide

    toy(5.0, WIDE)  # the arithmetic of width 2 only
    assert numerics.model_fingerprint(TOY, None, dim) == default
    assert numerics.model_fingerprint(TOY, {"width": 2}, dim) != wide
    capsys.readouterr()
    assert _statuses(run_benchmark(config)) == {f"{TOY}/0": "finished"}  # retrained, not reused
    assert f"{TOY} changed since commit" in capsys.readouterr().err


@pytest.mark.heavy  # a benchmark command twice
def test_runs_stored_without_fingerprints_are_retrained_once_said(mlflow_store, capsys):
    from tasks.cell import CellRuntime, run_cell

    (cell,) = _config(methods=["node"], seeds=[0]).cells()
    tracker = connect()
    rt = CellRuntime.for_store(tracker.store, parent_run_id=None, profile="smoke")
    result = run_cell(cell, rt)
    tracker.store.client.delete_tag(result.run_id, RunTags.NUMERICS_MODEL)  # as stored before
    capsys.readouterr()
    assert stored_results(tracker.queries, [cell])[1] == [cell]
    assert "1 finished cell stored without numerics fingerprints" in capsys.readouterr().err
    assert [r.run_id for r in stored_results(tracker.queries, [cell], "config")[0]] == [
        result.run_id
    ]


def test_runs_fingerprinted_by_earlier_canaries_are_retrained_without_blaming_a_model(
    mlflow_store, capsys
):
    """A run stored before the canaries ran the cell's sizes carries a format-1 fingerprint
    (no ``numerics.format`` tag): retrained once, said as such, not as "node changed"; a run of
    today's format whose fingerprint differs names its model."""
    from tasks.cell import CellRuntime, run_cell

    (cell,) = _config(methods=["node"], seeds=[0]).cells()
    tracker = connect()
    rt = CellRuntime.for_store(tracker.store, parent_run_id=None, profile="smoke")
    result = run_cell(cell, rt)
    tags = connect().queries.get_run_data(result.run_id).tags
    assert tags[RunTags.NUMERICS_FORMAT] == numerics.FINGERPRINT_FORMAT
    client = tracker.store.client
    client.set_tag(result.run_id, RunTags.NUMERICS_MODEL, "0123456789abcdef")  # another canary's
    client.delete_tag(result.run_id, RunTags.NUMERICS_FORMAT)  # as stored before the tag
    capsys.readouterr()
    assert stored_results(tracker.queries, [cell])[1] == [cell]
    err = capsys.readouterr().err
    assert "1 finished cell fingerprinted by earlier numerics canaries" in err
    assert "node changed" not in err
    client.set_tag(result.run_id, RunTags.NUMERICS_FORMAT, numerics.FINGERPRINT_FORMAT)
    assert stored_results(tracker.queries, [cell])[1] == [cell]
    assert "node changed since commit" in capsys.readouterr().err


def test_runs_fingerprinted_by_the_canaries_before_format_3_are_reused_where_those_still_agree(
    mlflow_store,
):
    """Format 2.1's canaries trained by their own protocol and took of the data only the
    normalisation and a sub-sample; a cell trained otherwise (another step size, noisy data)
    has other fingerprints today. A run they fingerprinted is reused where they still compute
    what it recorded (as they would have reused it), and retrained, said as such, where not."""
    from tasks.cell import CellRuntime, run_cell
    from tasks.machine.numerics import earlier_fingerprints, stale, warm

    config = _config(methods=["node"], seeds=[0])
    raw = config.model_dump()
    raw["training"]["lr"], raw["data"]["noise_std"] = 3e-3, 0.05
    (cell,) = RunConfig.model_validate(raw).cells()
    tracker = connect()
    rt = CellRuntime.for_store(tracker.store, parent_run_id=None, profile="smoke")
    result = run_cell(cell, rt)
    earlier = earlier_fingerprints(cell, "2.1")
    assert earlier is not None and earlier != cell_fingerprints(cell)
    assert earlier_fingerprints(cell, "1") is None
    client = tracker.store.client
    for tag, value in zip((RunTags.NUMERICS_MODEL, RunTags.NUMERICS_SYSTEM), earlier, strict=True):
        client.set_tag(result.run_id, tag, value)
    client.set_tag(result.run_id, RunTags.NUMERICS_FORMAT, "2.1")
    assert stored_results(tracker.queries, [cell])[1] == []  # reused
    client.set_tag(result.run_id, RunTags.NUMERICS_MODEL, "0123456789abcdef")
    assert stored_results(tracker.queries, [cell])[1] == [cell]
    (record,) = tracker.queries.finished_cell_runs([cell.config_hash()])[cell.config_hash()]
    retrained, lines = stale([cell], {cell.config_hash(): record}, warm([cell]))
    assert retrained == {cell.config_hash()}
    assert lines[0].startswith("1 finished cell fingerprinted by earlier numerics canaries")


def test_switching_numerics_back_and_forth_retrains_nothing_already_in_the_store(
    mlflow_store, monkeypatch
):
    """As ``NLLAB_CPU_NUMERICS=native`` and back to the default on one home: each mode trains a
    cell once; afterwards every switch reuses the finished run of that mode's fingerprints, the
    older one included (the mode faked as another model fingerprint: no second canary)."""
    from tasks.cell import CellRuntime, run_cell
    from tasks.machine import numerics as cell_numerics  # what a cell's tags and reuse read

    (cell,) = _config(methods=["node"], seeds=[0]).cells()
    tracker = connect()
    rt = CellRuntime.for_store(tracker.store, parent_run_id=None, profile="smoke")
    portable = cell_numerics.model_fingerprint

    def native(method: str, overrides=None, state_dim: int = 2, training=None) -> str:
        return "native" + portable(method, overrides, state_dim, training)[6:]

    trained: dict[str, str] = {}
    retrained = []
    for mode in ("portable", "native", "portable", "native", "portable"):
        fingerprint = native if mode == "native" else portable
        monkeypatch.setattr(cell_numerics, "model_fingerprint", fingerprint)
        reused, todo = stored_results(tracker.queries, [cell])
        if todo:
            retrained.append(mode)
            trained[mode] = run_cell(cell, rt).run_id
        else:
            assert [r.run_id for r in reused] == [trained[mode]]
    assert retrained == ["portable", "native"]  # then 0 retrained in three switches


@pytest.mark.heavy  # the deployment served and run
def test_the_nightly_deployment_records_its_comparison_as_prefect_artifacts(
    mlflow_store, prefect_server
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.serve.deployments import build_deployments, load_schedules, scheduled_benchmark

    (nightly,) = [d for d in build_deployments(load_schedules()) if d.name == "benchmark-nightly"]
    small = {
        "systems": ["integro_de"],
        "methods": ["node"],
        "seeds": [0, 1],
        "data": {"n_trajectories": 24, "n_points": 30},
        "max_workers": 1,
        "tracking": {"register_models": False},
    }
    params = {**nightly.parameters, "config": {**nightly.parameters["config"], **small}}
    start = datetime.now(UTC)  # the session's server holds other tests' artifacts
    for _night in range(2):
        assert scheduled_benchmark(**params).endswith("0 regressed")
    tracker = connect()
    latest = tracker.queries.finished_runs("benchmark")[0]
    assert latest.metrics["regressions"] == 0
    assert latest.tags[RunTags.CELLS_REUSED] == "2"  # the second night reused both
    keys = ["nllab-benchmark-smoke-results", "nllab-benchmark-smoke-comparison"]
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[*keys, keys[1] + "-table"]))
        )
    by_key: dict[str, list] = {}
    for a in found:
        if a.created >= start:
            by_key.setdefault(a.key, []).append(a)
    assert len(by_key[keys[0]]) == 2 and all(a.type == "table" for a in by_key[keys[0]])
    assert len(by_key[keys[1]]) == 2  # each night's comparison, the first with nothing before
    newest = max(by_key[keys[1]], key=lambda a: a.created)
    assert "2 unchanged" in newest.data and "0 regressed" in newest.data
    assert len(by_key[keys[1] + "-table"]) == 1


def test_a_model_that_fails_as_it_runs_gets_a_fingerprint_that_matches_nothing(
    tmp_path, monkeypatch, capsys
):
    """Its cells then fail on their own, with their error, instead of the whole command."""
    from nlmodels.baselines.ode import NODE

    monkeypatch.setattr(numerics, "_TOLD", set())  # told once per process: an earlier test may have
    monkeypatch.setattr(numerics, "_cache_dirs", lambda: [tmp_path])
    monkeypatch.setattr(numerics, "_MEMO", {})

    def broken(self, *a, **k):
        raise RuntimeError("the vector field blew up")

    monkeypatch.setattr(NODE, "forward", broken)
    failed = numerics.model_fingerprint("node")
    assert failed.startswith("failed-") and not list(tmp_path.iterdir())  # nothing cached
    assert "the numerics canary of model node (2-D) failed" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(numerics, "_cache_dirs", lambda: [tmp_path])
    monkeypatch.setattr(numerics, "_MEMO", {})
    assert not numerics.model_fingerprint("node").startswith("failed-")


_FINGERPRINT_CHILD = """
import nlmodels
nlmodels.set_up_numerics()
from nltrain.numerics import model_fingerprint
print(model_fingerprint("neural_laplace"))
"""


@pytest.mark.slow  # three builds of the native kernels and their canaries: two minutes
def test_a_home_shared_by_two_kernel_targets_gives_each_its_own_fingerprint(tmp_path):
    """The native mode builds the kernels for this CPU (``-march=native``) or for the target
    ``NLLAB_NATIVE_MARCH`` names: two builds whose bytes can differ (8- or 4-wide vectors). A
    fingerprint read from a home the other build filled is the one that build computes in a
    fresh home, as on two CPUs sharing a home."""

    from nlmodels.accel import native

    if not native.usable():
        pytest.skip("the native kernels do not build here")

    def fingerprint(home: str, march: str) -> str:
        env = {**os.environ, "NLLAB_HOME": home, "NLLAB_CPU_NUMERICS": "native"}
        env["NLLAB_INSTALL_CACHE"] = f"{home}/installation"  # each home its own installation
        env.update(NLLAB_NATIVE_MARCH=march, PYTHONPATH=str(ROOT))
        done = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT_CHILD],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()[-1]

    shared = str(tmp_path / "shared")
    fingerprint(shared, "")  # this CPU's build fills the home first
    assert fingerprint(shared, "haswell") == fingerprint(str(tmp_path / "fresh"), "haswell")


def test_a_cells_protocol_and_data_reach_their_canaries_whole():
    """Every setting of a cell's protocol and data is one its canaries take (no list of the
    ones that matter to keep up): a field of either configuration that the canaries do not
    know fails here, the sizes alone are the canaries' own, and a name that is no setting is
    refused by name."""
    from nltrain import TrainConfig
    from nltrain.numerics import canary_split, canary_training
    from tasks.config import DataConfig
    from tasks.ledger.scope import ledger_cell_configs
    from tasks.machine.numerics import data_settings

    assert canary_training(TrainConfig().model_dump()) == {"patience": 2}  # a stop, never reached
    for cell, _ in ledger_cell_configs(seeds=[0]):  # the ledger's fingerprints stay as they were
        assert canary_training(cell.training) == {}
        assert canary_split(data_settings(cell)) == {"normalise_on": "all"}
    # the sizes are the canary's own; the rest is the cell's
    assert canary_training({"epochs": 7, "batch_size": 3, "patience": None}) == {}
    assert canary_training({"dtype": "float32", "grad_clip": None, "lr": 3e-4}) == {
        "dtype": "float32", "grad_clip": None, "lr": 3e-4,
    }  # fmt: skip
    fields = DataConfig.model_fields.keys() - {"source"}  # the source is the system's name
    every = {name: getattr(DataConfig(), name) for name in fields}
    assert canary_split(every) == {}  # each known, each at its default
    split = canary_split({"n_trajectories": 500, "n_train": 24, "noise_std": 0.1})
    assert split == {"n_train": 6, "noise_std": 0.1} == canary_split(split)
    assert canary_split({"fractions": [0.8, 0.1, 0.1]}) == {}  # a list spells the tuple
    with pytest.raises(ValueError, match=r"unknown training setting.*learning_rate"):
        canary_training({"learning_rate": 1e-3})
    with pytest.raises(ValueError, match=r"unknown data setting.*trajectories"):
        canary_split({"trajectories": 10})
    with pytest.raises(TypeError, match=r"mapping of datasets\.simulate/prepare keywords"):
        canary_split("all")  # a normalisation alone, as the argument once was
    with pytest.raises(TypeError, match="TrainConfig or a mapping"):
        canary_training(3e-4)


def test_a_protocol_that_takes_other_code_has_its_own_fingerprint(tmp_path, monkeypatch):
    """A cell trained in float32, or without clipping, runs code a float64 clipped cell does
    not: its model fingerprint is that code's. A stop the canary never reaches, or another
    size, is the same fingerprint; so is a data set only larger; noise is not."""
    monkeypatch.setattr(numerics, "_cache_dirs", lambda: [tmp_path])
    monkeypatch.setattr(numerics, "_MEMO", {})

    def model(**training) -> str:
        return numerics.model_fingerprint("node", None, 1, training)

    plain = model()
    assert model(dtype="float32") != plain != model(grad_clip=None)
    assert model(patience=5, max_train_seconds=60.0, epochs=9, batch_size=3) == plain
    assert not model(dtype="float32").startswith("failed-")
    system = numerics.system_fingerprint
    assert system("integro_de", {"n_trajectories": 500}) == system("integro_de")
    assert system("integro_de", {"noise_std": 0.2}) != system("integro_de")
    assert system("integro_de", {"n_train": 24}) == system("integro_de", {"n_train": 90})
    # a split the canary's data cannot take, as a cell's could not: said, not raised
    assert system("integro_de", {"fractions": (0.001, 0.4995, 0.4995)}).startswith("failed-")
