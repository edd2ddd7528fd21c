"""Systems from data files and simulators, and models from plugins: the cell hash follows a
file's content (not its path) and a simulator's source (plugins that collide: test_plugins)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from tasks.config import resolve_config

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("forget_declared_systems")


def _write_csv(path: Path, x: np.ndarray, t: np.ndarray) -> Path:
    rows = ["trajectory,t,u,v"] + [
        f"{n},{float(t[i])!r},{float(x[n, i, 0])!r},{float(x[n, i, 1])!r}"
        for n in range(x.shape[0])
        for i in range(t.size)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def _hashes(cfg_dir: Path, data: Path, extra: str = "") -> dict[str, str]:
    cfg = cfg_dir / "c.toml"
    cfg.write_text(
        f'systems = ["lab", "sine"]\nmethods = ["node"]\n[define_systems.lab]\nfile = "{data}"\n'
        + extra
    )
    return {c.key: c.config_hash() for c in resolve_config("smoke", cfg).cells()}


def test_the_cell_hash_follows_the_file_content_not_its_path(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t, x = np.linspace(0.0, 1.0, 8), rng.standard_normal((12, 8, 2))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = _hashes(tmp_path, _write_csv(tmp_path / "a" / "lab.csv", x, t))
    moved = _hashes(tmp_path, _write_csv(tmp_path / "b" / "elsewhere.csv", x, t))
    assert first == moved
    x[3, 4, 1] += 1e-9  # one value of one trajectory edited
    edited = _hashes(tmp_path, _write_csv(tmp_path / "b" / "elsewhere.csv", x, t))
    assert edited["lab/node/seed0"] != first["lab/node/seed0"]
    assert edited["sine/node/seed0"] == first["sine/node/seed0"]  # a built-in cell: untouched


def test_a_data_file_system_gets_its_own_split_and_n_observed(tmp_path: Path) -> None:
    from tasks.cell import prepare_cell, simulate_data

    rng = np.random.default_rng(1)
    t, x = np.linspace(0.0, 2.0, 10), rng.standard_normal((20, 10, 2))
    data = _write_csv(tmp_path / "lab.csv", x, t)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'systems = ["lab"]\nmethods = ["node"]\n[define_systems.lab]\n'
        f'file = "{data}"\nn_observed = 3\n'
    )
    (cell,) = resolve_config("smoke", cfg).cells()
    assert cell.data.n_observed == 3 and cell.data.n_trajectories == 20  # smoke asks 40: capped
    ds = simulate_data(cell.system, cell.data, cell.seed, tmp_path / "cache")
    np.testing.assert_array_equal(ds.x, x)  # every value as written (repr round-trips)
    np.testing.assert_array_equal(ds.t, t)
    prepared = prepare_cell(cell, ds)
    # the platform's windows: the 3 observed points right before the forecast half
    np.testing.assert_array_equal(prepared.train.obs_t, t[2:5])
    np.testing.assert_array_equal(prepared.train.query_t, t[5:])
    rows = np.concatenate([prepared.train.index, prepared.val.index, prepared.test.index])
    assert sorted(rows.tolist()) == list(range(20))
    # the run's MLflow dataset input is the file itself: its path and content digest
    from datasets import file_digest
    from tasks.pipeline import data_outcome

    logged = data_outcome(cell, ds, prepared).dataset
    assert logged.source == str(data.resolve()) and logged.digest == file_digest(data)


def test_a_simulator_system_hashes_its_source_and_options(tmp_path: Path, monkeypatch) -> None:
    from tasks.cell import simulate_data

    module = tmp_path / "my_sim.py"
    code = textwrap.dedent(
        """
        import numpy as np

        def decay(n_trajectories, seed, rate=1.0):
            t = np.linspace(0.0, 3.0, 12)
            x0 = np.random.default_rng(seed).uniform(1.0, 2.0, n_trajectories)
            return t, (x0[:, None] * np.exp(-rate * t))[..., None]
        """
    )
    module.write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "c.toml"

    def cell(rate: float):
        cfg.write_text(
            'systems = ["decay"]\nmethods = ["node"]\n[define_systems.decay]\n'
            f'simulator = "my_sim:decay"\noptions = {{ rate = {rate} }}\n'
        )
        return resolve_config("smoke", cfg).cells()[0]

    a = cell(1.0)
    ds = simulate_data(a.system, a.data, a.seed, tmp_path / "cache")
    assert ds.x.shape == (40, 12, 1)
    # the analytic answer: each trajectory is x0 exp(-t)
    np.testing.assert_allclose(ds.x[:, :, 0] / ds.x[:, :1, 0], np.exp(-ds.t)[None].repeat(40, 0))
    assert cell(2.0).config_hash() != a.config_hash()
    module.write_text(code.replace("uniform(1.0, 2.0", "uniform(1.0, 3.0"))
    sys.modules.pop("my_sim", None)
    assert cell(1.0).config_hash() != a.config_hash()


EXAMPLE = ROOT / "examples" / "pendulum_lab.toml"


def test_listing_names_imports_no_torch_and_systems_lists_a_declared_file(tmp_path) -> None:
    code = (
        "import sys\nfrom flows.cli import main\n"
        "assert main(['models', '--names']) == 0\n"
        "assert main(['systems', '--names']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        f"assert main(['systems', '--config', {str(EXAMPLE)!r}]) == 0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    names = proc.stdout.split()
    assert {"node", "neural_laplace", "integro_de", "spiral_dde"} <= set(names)
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("pendulum_lab ")]
    assert line.split()[1] == "2" and "N=60 T=100" in line and "pendulum.csv (sha256" in line


def test_a_plugin_model_without_a_space_gets_one_around_its_typed_defaults() -> None:
    import optuna

    from nlmodels import ForecastModel
    from nlmodels.model_registry import MODELS
    from tasks.tuning.search_spaces import paper_params, search_space

    class Toy(ForecastModel):
        def __init__(
            self,
            state_dim: int,
            *,
            width: int = 32,
            scale: float = 0.5,
            gate: bool = True,
            act: Literal["tanh", "relu"] = "tanh",
            hidden: tuple[int, ...] = (16, 16),
        ) -> None:
            super().__init__()

    MODELS["toy_space_test"] = Toy
    try:
        space = search_space("toy_space_test")
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
        study.enqueue_trial(paper_params("toy_space_test"))
        first = space.draw(study.ask())  # the model's own defaults, as the paper point
        assert first.model == {
            "width": 32,
            "scale": 0.5,
            "gate": True,
            "act": "tanh",
            "hidden": (16, 16),
        }
        for _ in range(20):
            m = space.draw(study.ask()).model
            assert 8 <= m["width"] <= 128 and 0.05 <= m["scale"] <= 5.0
            assert m["act"] in ("tanh", "relu") and isinstance(m["gate"], bool)
            assert 1 <= len(m["hidden"]) <= 3 and 4 <= m["hidden"][0] <= 64
    finally:
        del MODELS["toy_space_test"]


def test_a_class_named_module_colon_class_is_a_method_and_a_bad_one_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from flows.cli.common import check_names
    from nlmodels.model_registry import MODELS, build_model
    from tasks.config import ConfigError

    (tmp_path / "toymod.py").write_text(
        textwrap.dedent(
            """
            import torch
            from nlmodels import ForecastModel

            class Last(ForecastModel):  # not registered: named by module:Class
                def __init__(self, state_dim: int, *, gain: float = 1.0) -> None:
                    super().__init__()
                    self.gain = torch.nn.Parameter(torch.tensor(gain, dtype=torch.float64))

                def forward(self, obs_t, obs_x, query_t):
                    last = obs_x[:, -1:, :]
                    return self.gain * last.expand(-1, query_t.shape[-1], -1)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        check_names(methods=["toymod:Last", "node"])  # the fast check lets it through
        cells = resolve_config("smoke", overrides={"methods": ["toymod:Last"]}).cells()
        assert {c.method for c in cells} == {"toymod:Last"}
        model = build_model("toymod:Last", 2, gain=2.0).double()
        x = torch.arange(12.0, dtype=torch.float64).reshape(1, 6, 2)
        y = model(torch.arange(6.0), x, torch.arange(6.0, 9.0))
        torch.testing.assert_close(y, 2.0 * x[:, -1:, :].expand(1, 3, 2))
        with pytest.raises(ConfigError, match="method 'toymod:Nope' cannot be imported"):
            resolve_config("smoke", overrides={"methods": ["toymod:Nope"]})
    finally:
        MODELS.pop("toymod:Last", None)
        sys.modules.pop("toymod", None)


def test_a_simulator_from_an_nllab_systems_entry_point(
    tmp_path: Path, monkeypatch, fake_distribution
) -> None:
    from flows.cli.common import check_names
    from tasks.cell import simulate_data

    (tmp_path / "ramp_sim.py").write_text(
        "import numpy as np\n\n"
        "def ramp(n_trajectories, seed, slope=1.0):\n"
        "    t = np.linspace(0.0, 1.0, 6)\n"
        "    x0 = np.arange(n_trajectories, dtype=float)\n"
        "    return t, (x0[:, None] + slope * t)[..., None]\n"
    )
    fake_distribution(tmp_path, "ramp", "nllab.systems", {"ramp": "ramp_sim:ramp"})
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'systems = ["my_ramp"]\nmethods = ["node"]\n[define_systems.my_ramp]\n'
        'simulator = "ramp"\noptions = { slope = 3.0 }\n'
    )
    (cell,) = resolve_config("smoke", cfg).cells()
    ds = simulate_data(cell.system, cell.data, cell.seed, tmp_path / "cache")
    # every trajectory rises by slope × t from its start
    np.testing.assert_allclose(ds.x[:, :, 0] - ds.x[:, :1, 0], 3.0 * np.tile(ds.t, (40, 1)))
    # named directly in systems, the installed simulator runs with its defaults (slope 1)
    (cell,) = resolve_config("smoke", overrides={"systems": ["ramp"], "methods": ["node"]}).cells()
    assert cell.data.source is not None and cell.data.source.simulator == "ramp"
    ds = simulate_data(cell.system, cell.data, cell.seed, tmp_path / "cache")
    np.testing.assert_allclose(ds.x[:, :, 0] - ds.x[:, :1, 0], 1.0 * np.tile(ds.t, (40, 1)))
    check_names(systems=["ramp"])  # the command line's quick check knows it too


def test_a_data_file_systems_cells_get_fingerprints_in_a_process_new_to_it(tmp_path: Path):
    """A worker process that has not declared the system yet (as a Dask worker's first cell):
    its cells' fingerprints are those of its state dimension, read from its file."""
    from datasets import _systems
    from nltrain.numerics import model_fingerprint
    from tasks.config import declarations as _declarations
    from tasks.machine.numerics import cell_fingerprints

    rng = np.random.default_rng(2)
    t, x = np.linspace(0.0, 2.0, 10), rng.standard_normal((20, 10, 3))
    rows = ["trajectory,t,u,v,w"] + [
        f"{n},{float(t[i])!r}," + ",".join(repr(float(v)) for v in x[n, i])
        for n in range(20)
        for i in range(10)
    ]
    (tmp_path / "lab.csv").write_text("\n".join(rows) + "\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'systems = ["lab"]\nmethods = ["node"]\n[define_systems.lab]\nfile = "lab.csv"\n'
    )
    (cell,) = resolve_config("smoke", cfg).cells()
    for table in (_systems.SYSTEM_SPECS, _systems._INFOS, _declarations._DECLARED):
        table.pop("lab", None)  # a process new to it
    model, _ = cell_fingerprints(cell)
    assert model == model_fingerprint("node", None, 3) != model_fingerprint("node", None, 2)
