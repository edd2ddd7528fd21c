"""Every study's smoke run: its tables and figures land as artifacts of one MLflow parent run,
with the expected rows and columns; cells are reused by config hash; the NFE claim holds and the
frequency-filter study's tone measure is exact."""

from __future__ import annotations

import itertools
import json

import pandas as pd
import pytest

pytestmark = pytest.mark.usefixtures("prefect_server")

#: study -> table -> (key columns, extra columns, number of rows in the smoke profile)
EXPECTED: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...], int]]] = {
    "stereographic": {"stereographic": (("system", "stereographic"), (), 2)},
    "latent-dim": {"latent_dim": (("system", "latent_dim"), (), 2)},
    "noise": {"noise": (("system", "noise_std", "method"), (), 2)},
    "sample-size": {"sample_size": (("system", "N", "n_train", "method"), (), 4)},
    "observation-size": {"observation_size": (("system", "n_observed", "method"), (), 4)},
    "ilt": {
        "ilt_accuracy": (("algorithm",), ("us_per_point",), 6),
        "ilt_training": (("system", "ilt"), (), 2),
    },
    "solvers": {"solvers": (("system", "method", "solver"), (), 3)},
    "nfe": {
        # (NFEs only: the model's; the seconds an extrapolation takes are the machine's)
        "nfe_horizon": (("method", "dt"), (), 9),
        "nfe_points": (("method", "n_points"), (), 9),
    },
    "wallclock": {"wallclock": (("method", "solver"), ("nfe_per_batch", "x_neural_laplace"), 2)},
    "cmi": {"cmi": (("system", "method"), (), 2)},
    "waveforms": {"waveforms": (("system", "method"), (), 2)},
    "frequency-filter": {
        "frequency_filter": (
            ("system", "variant"),
            ("rmse_to_corrupted", "corruption_amplitude"),
            2,
        )
    },
}
VALUE_COLUMNS = ["value", "std", "n", "paper", "gap", "verdict"]


#: The studies whose smoke run the heavy tier checks (CI runs it after the default suite): the
#: default keeps those other tests read and the cheapest, each study's own code runs in both.
HEAVY_SMOKE = frozenset(
    {"latent-dim", "noise", "sample-size", "observation-size", "solvers", "cmi", "frequency-filter"}
)
STUDY_NAMES = [
    pytest.param(name, marks=pytest.mark.heavy) if name in HEAVY_SMOKE else name
    for name in EXPECTED
]


class _SmokeRuns(dict):
    """Each study run once with the smoke profile, when a test first asks for it."""

    def __missing__(self, name: str):
        from flows.studies import run_study, study_config

        self[name] = summary = run_study(study_config(name, "smoke"))
        return summary


@pytest.fixture(scope="module")
def smoke(module_mlflow_store):
    import torch

    torch.set_num_threads(1)
    return _SmokeRuns()


def _tracker():
    from tasks.tracking import connect

    return connect()


def test_registry_and_unknown_name():
    from flows.studies import STUDIES, get_study, study_config

    assert list(STUDIES) == list(EXPECTED)
    with pytest.raises(ValueError, match="valid studies: stereographic, latent-dim"):
        get_study("stereo")
    with pytest.raises(ValueError, match="unknown system"):
        study_config("noise", "smoke", systems=["nope"])


@pytest.mark.parametrize("name", STUDY_NAMES)
def test_smoke_artifacts(smoke, name, tmp_path):
    summary = smoke[name]
    tracker = _tracker()
    run_id = tracker.queries.latest_run(f"study:{name}")
    assert run_id == summary.parent_run_id
    run = tracker.queries.get_run_data(run_id)
    assert run.status == "FINISHED"
    assert run.tags["nllab.study"] == name and run.tags["profile"] == "smoke"
    root = tracker.queries.download(run_id, "study", tmp_path)
    meta = json.loads((root / "study.json").read_text())
    paper = json.loads((root / "paper.json").read_text())
    assert meta["study"] == name and paper["paper_ref"]
    assert sorted(meta["tables"]) == sorted(EXPECTED[name])
    for table, (keys, extra, n_rows) in EXPECTED[name].items():
        frame = pd.read_csv(root / "tables" / f"{table}.csv")
        assert set([*keys, *VALUE_COLUMNS, *extra]) <= set(frame.columns), frame.columns
        assert list(frame.columns[: len(keys)]) == list(keys)
        assert len(frame) == n_rows
        assert frame["value"].notna().all(), frame
        assert (root / "tables" / f"{table}.md").read_text().startswith("| " + keys[0])
    pngs = sorted((root / "figures").glob("*.png"))
    assert pngs and [p.name for p in pngs] == list(meta["figures"])
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    # Training studies: their cells are child runs of the study's parent run.
    if summary.cells:
        assert all(c.ok for c in summary.cells)
        children = {r.run_id for r in tracker.queries.child_runs(run_id)}
        assert {c.run_id for c in summary.cells if c.status == "finished"} <= children


def test_paper_numbers_beside_ours(smoke):
    frame = smoke["stereographic"].tables["stereographic"]
    assert frame.set_index("stereographic").loc["on", "paper"] == pytest.approx(0.0036)
    row = frame.iloc[0]
    assert row["gap"] == pytest.approx(row["value"] - row["paper"])
    acc = smoke["ilt"].tables["ilt_accuracy"].set_index("algorithm")
    # Table 12 is deterministic: our ILTs match the paper's RMSE.
    assert (acc.loc[["fourier", "talbot", "stehfest", "cme"], "verdict"] == "match").all()


def test_cells_are_reused(smoke):
    from flows.studies import run_study, study_config

    again = run_study(study_config("stereographic", "smoke"))
    assert again.cells and all(c.status == "reused" for c in again.cells)
    first = {c.config_hash: c.run_id for c in smoke["stereographic"].cells}
    assert {c.config_hash: c.run_id for c in again.cells} == first


def test_nfe_constant_for_neural_laplace_growing_for_node(smoke):
    frame = smoke["nfe"].tables["nfe_horizon"]
    nl = frame[frame.method == "neural_laplace"].sort_values("dt")["value"].to_numpy()
    assert len(set(nl)) == 1 and nl[0] >= 1
    for method in ("node", "anode"):
        v = frame[frame.method == method].sort_values("dt")["value"].to_numpy()
        assert all(b >= a for a, b in itertools.pairwise(v)), v  # non-decreasing in Δt
        assert v[-1] > v[-2] and v[-1] > nl[-1], v  # strictly more at the longest horizon


def test_cli_runs_a_study_and_rejects_unknown(smoke, capsys):
    from flows.cli import main

    assert smoke["waveforms"].cells  # (its cells trained first: the command reuses them)

    assert main(["study", "waveforms", "--profile", "smoke", "--seeds", "0"]) == 0
    out = capsys.readouterr().out
    assert "2 cells, 2 reused, 0 failed" in out  # the smoke cells, reused
    # its tables as the benchmark prints its own: a rule under the header, no Markdown
    lines = out.splitlines()
    assert "waveforms" in lines and "## waveforms" not in out and "|---" not in out
    assert lines[lines.index("waveforms") + 3].startswith("─")
    assert main(["study", "nope", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert "unknown study 'nope'" in err and "frequency-filter" in err


def test_study_cli_takes_the_task_runner_flags(monkeypatch, capsys):
    from flows.cli import main
    from tasks.stopping import Stopped

    ran = []

    def stop_before_running(config):  # the study's config as `nllab study` built it
        ran.append(config.run)
        raise Stopped()  # Ctrl-C, as nllab's handler raises it

    monkeypatch.setattr("flows.studies.run_study", stop_before_running)
    args = ["study", "noise", "--profile", "smoke"]
    assert main([*args, "--task-runner", "dask", "--max-workers", "3"]) == 130
    assert main(args) == 130
    assert ran[0].execution.task_runner == "dask" and ran[0].execution.max_workers == 3
    assert ran[1].execution.task_runner == "thread"


def test_tone_amplitude_is_exact_on_any_grid():
    """The frequency-filter study's 'corruption_amplitude': the least-squares amplitude of the
    11 rad/s component beside the clean signal's sin t + sin 2t, exact on an irregular grid."""
    import numpy as np

    from flows.studies.frequency_filter import tone_amplitude

    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(10.0, 20.0, size=(2, 80)), axis=1)
    clean = np.sin(t + 0.7) + np.sin(2 * (t + 0.7)) + 0.2
    tone = np.stack([0.3 * np.cos(11 * t[0]) - 0.4 * np.sin(11 * t[0]), 0.1 * np.sin(11 * t[1])])
    assert tone_amplitude(clean + tone, t) == pytest.approx((0.5 + 0.1) / 2, abs=1e-12)
    assert tone_amplitude(clean, t) == pytest.approx(0.0, abs=1e-12)


def test_stereographic_on_is_the_benchmark_cell(monkeypatch):
    """The study's "on" cells are the benchmark's Neural Laplace cells (same config hash), so a
    study after a benchmark of the same profile reuses them; "off" differs only in the map."""
    import dataclasses

    from flows.studies import STUDIES, StudyContext, stereographic, study_config
    from tasks.config import resolve_config

    captured = []
    monkeypatch.setattr(
        stereographic, "rmse_table", lambda ctx, entries, keys: captured.extend(entries)
    )
    monkeypatch.setattr(stereographic, "plot_bars", lambda *a, **k: None)
    monkeypatch.setattr(stereographic, "StudyOutput", lambda tables: tables)
    config = study_config("stereographic", "smoke")
    study = STUDIES["stereographic"]
    fields = {f.name: None for f in dataclasses.fields(StudyContext) if f.init}
    ctx = StudyContext(**{**fields, "config": config, "spec": study.spec})
    monkeypatch.setattr(StudyContext, "figure", lambda self, name: None)
    study.body(ctx)
    bench = {c.key: c.config_hash() for c in resolve_config("smoke").cells()}
    on = [c for keys, c in captured if keys["stereographic"] == "on"]
    off = [c for keys, c in captured if keys["stereographic"] == "off"]
    assert on and off
    assert all(bench[c.key] == c.config_hash() for c in on)
    assert all(bench[c.key] != c.config_hash() for c in off)


def test_every_study_sits_under_its_catalog_name():
    """The command line lists studies from the light catalog; each name runs the study that
    carries it, with the catalog's title."""
    from flows._study_catalog import STUDY_CATALOG
    from flows.studies import STUDIES

    assert list(STUDIES) == list(STUDY_CATALOG)
    for name, study in STUDIES.items():
        assert study.spec.name == name
        assert study.spec.title == STUDY_CATALOG[name].title


@pytest.mark.parametrize("name", STUDY_NAMES)
def test_every_study_table_is_a_keyed_prefect_table_artifact(smoke, name):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.runtime._artifacts import artifact_key

    assert smoke[name].parent_run_id
    keys = {
        artifact_key("study", name, "smoke", table): rows
        for table, (_, _, rows) in EXPECTED[name].items()
    }
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=list(keys)))
        )
    assert {a.key for a in found} == set(keys)
    for a in found:
        data = json.loads(a.data) if isinstance(a.data, str) else a.data
        assert a.type == "table" and len(data) == keys[a.key], a.key
