"""Installed plugins, read from their packages' metadata: listed and refused without importing
any; the naming rule (a built-in name always wins; a name two packages claim is neither's,
both named with their packages) for models and simulators alike; ``module:Class`` reaches
either of two colliding models; a plugin is imported only when its name is used. The fake
distributions are ``.dist-info`` folders on ``sys.path``, as ``pip install`` leaves them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flows.cli import main
from tasks.config import ConfigError, resolve_config

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_MODULES = ("plug_a", "plug_b", "plug_c", "impostor_mod", "sims_one", "sims_two")

_MODEL = """
    from nlmodels import ForecastModel, register_model

    @register_model("shared_name")
    class {cls}(ForecastModel):
        def __init__(self, state_dim: int, *, width: int = 4) -> None:
            super().__init__()
"""
_SIM = """
    import numpy as np

    def ramp(n_trajectories, seed, slope={slope}):
        t = np.linspace(0.0, 1.0, 6)
        return t, (np.arange(n_trajectories, dtype=float)[:, None] + slope * t)[..., None]
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_distribution) -> Path:
    """Six fake packages: two models claiming one name, one claiming the built-in 'node', one
    that fails to import; two simulators claiming one name, one claiming the built-in 'sine'."""
    from nlmodels.model_registry import MODELS

    site = tmp_path / "site"
    site.mkdir()
    for package, module, cls in (
        ("first-plugin", "plug_a", "ModelA"),
        ("second-plugin", "plug_b", "ModelB"),
    ):
        fake_distribution(site, package, "nllab.models", {"shared_name": module})
        (site / f"{module}.py").write_text(textwrap.dedent(_MODEL.format(cls=cls)))
    fake_distribution(site, "impostor", "nllab.models", {"node": "impostor_mod:Impostor"})
    (site / "impostor_mod.py").write_text("raise ImportError('never imported')\n")
    fake_distribution(site, "broken", "nllab.models", {"plug_c": "plug_c"})
    (site / "plug_c.py").write_text("raise ImportError('needs a library not installed')\n")
    for package, module, slope in (("sim-one", "sims_one", 1.0), ("sim-two", "sims_two", 2.0)):
        fake_distribution(site, package, "nllab.systems", {"twice_ramp": f"{module}:ramp"})
        (site / f"{module}.py").write_text(textwrap.dedent(_SIM.format(slope=slope)))
    fake_distribution(site, "sine-again", "nllab.systems", {"sine": "sims_one:ramp"})
    monkeypatch.syspath_prepend(str(site))
    before = dict(MODELS)
    yield site
    MODELS.clear()
    MODELS.update(before)
    for module in PLUGIN_MODULES:
        sys.modules.pop(module, None)


def test_colliding_models_are_listed_and_refused_naming_both_packages(site, capsys) -> None:
    from flows.cli.common import check_names

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert (
        "left out: model name 'shared_name' is claimed by plug_a (package first-plugin) and "
        "plug_b (package second-plugin): none is used by that name (name one as --methods "
        "MODULE:CLASS)"
    ) in out
    assert (
        "left out: model plugin impostor_mod:Impostor (package impostor) claims the built-in "
        "name 'node': the built-in is used"
    ) in out
    assert "plug_c          plugin plug_c (package broken)" in out  # listed; it is not imported
    with pytest.raises(ConfigError, match=r"'shared_name' is claimed by plug_a .* and plug_b"):
        resolve_config("smoke", overrides={"methods": ["shared_name"]})
    with pytest.raises(ConfigError, match=r"'shared_name' is claimed by plug_a .* and plug_b"):
        check_names(methods=["shared_name"])  # the command line's fast check
    assert not set(PLUGIN_MODULES) & set(sys.modules)  # listing and refusing imported none


def test_module_class_reaches_either_and_the_built_in_name_stays_built_in(site) -> None:
    from nlmodels.model_registry import build_model, find_model

    a, b = build_model("plug_a:ModelA", 2), build_model("plug_b:ModelB", 2)
    assert (type(a).__name__, type(b).__name__) == ("ModelA", "ModelB")
    with pytest.raises(ValueError, match="'shared_name' is claimed by"):
        find_model("shared_name")  # both modules imported now: still neither's by name
    assert type(build_model("node", 2)).__module__ == "nlmodels.baselines.ode"
    assert "impostor_mod" not in sys.modules
    with pytest.raises(
        ValueError,
        match=r"model plugin 'plug_c' \(plug_c, package broken\) cannot be imported: "
        "ImportError: needs a library not installed",
    ):
        build_model("plug_c", 2)
    (cell,) = resolve_config(
        "smoke", overrides={"methods": ["plug_b:ModelB"], "systems": ["sine"]}
    ).cells()
    assert cell.method == "plug_b:ModelB"


def test_colliding_simulators_are_refused_and_module_function_reaches_either(site, capsys) -> None:
    from tasks.cell import simulate_data

    assert main(["systems"]) == 0
    out = capsys.readouterr().out
    assert (
        "left out: simulator name 'twice_ramp' is claimed by sims_one:ramp (package sim-one) "
        "and sims_two:ramp (package sim-two)"
    ) in out
    assert (
        "left out: simulator plugin sims_one:ramp (package sine-again) claims the built-in" in out
    )
    with pytest.raises(ConfigError, match="'twice_ramp' is claimed by sims_one:ramp"):
        resolve_config("smoke", overrides={"systems": ["twice_ramp"], "methods": ["node"]})
    cfg = site / "c.toml"
    cfg.write_text(
        'systems = ["my_ramp"]\nmethods = ["node"]\n[define_systems.my_ramp]\n'
        'simulator = "sims_two:ramp"\n'
    )
    (cell,) = resolve_config("smoke", cfg).cells()
    ds = simulate_data(cell.system, cell.data, cell.seed, site / "cache")
    assert float(ds.x[0, -1, 0] - ds.x[0, 0, 0]) == pytest.approx(2.0)  # sims_two's slope
    sine = resolve_config("smoke", overrides={"systems": ["sine"], "methods": ["node"]}).cells()[0]
    assert sine.data.source is None  # the built-in sine, not the plugin claiming its name


def test_list_status_and_usage_answers_load_no_plugin_and_no_heavy_stack(
    tmp_path, fake_distribution
) -> None:
    """With plugins installed (one that fails on import), the list and status commands and the
    usage errors import none of them, nor torch, MLflow or Prefect."""
    site = tmp_path / "site"
    fake_distribution(site, "slow-plugin", "nllab.models", {"slow_model": "slow_plug"})
    (site / "slow_plug.py").write_text("raise ImportError('imported to list names')\n")
    code = textwrap.dedent(
        """
        import sys
        from flows.cli import main
        assert main(["models"]) == 0
        assert main(["models", "--names"]) == 0
        assert main(["systems"]) == 0
        assert main(["compare"]) == 0
        for argv in (["tune", "--method", "unknown", "--system", "sine", "--trials", "2"],
                     ["benchmark", "--methods", "nosuchmodule:Net"],
                     ["benchmark", "--methods", "nod"]):
            assert main(argv) == 2, argv
        heavy = {"torch", "mlflow", "prefect", "optuna", "matplotlib", "scipy", "slow_plug"}
        assert not heavy & set(sys.modules), heavy & set(sys.modules)
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
        "NLLAB_HOME": str(tmp_path / "home"),
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "slow_model" in proc.stdout
    assert "unknown method 'unknown'" in proc.stderr and "no module 'nosuchmodule'" in proc.stderr
