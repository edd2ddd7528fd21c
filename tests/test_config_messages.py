"""Config problems named by their key in every command, data-file messages without numpy type
names, declared systems declared by an explicit step (validation reads them, declares nothing),
and a data set too small for its split said in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main
from tasks.config import (
    ConfigError,
    RunConfig,
    declare_systems,
    resolve_config,
)

pytestmark = pytest.mark.usefixtures("forget_declared_systems")


def _csv(path: Path, n: int, steps: int = 6, ragged: int | None = None) -> Path:
    rows = [
        f"{i},{0.1 * j:.3f},{float(i + j)}"
        for i in range(n)
        for j in range(steps - (1 if i == ragged else 0))
    ]
    path.write_text("trajectory,t,a\n" + "\n".join(rows) + "\n")
    return path


def test_a_config_typo_is_named_by_its_key_in_every_command(tmp_path, capsys) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('systems = ["lab"]\n[define_systems.lab]\nfile = "x.csv"\nstat = 3\n')
    for argv in (["systems", "--config", str(cfg)], ["benchmark", "--config", str(cfg)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "define_systems.lab.stat: unknown setting" in err, err
        assert "pydantic" not in err


def test_a_ragged_file_names_its_trajectory_without_numpy_type_names(tmp_path) -> None:
    data = _csv(tmp_path / "lab.csv", 8, ragged=5)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'systems = ["lab"]\nmethods = ["node"]\n[define_systems.lab]\nfile = "{data}"\n'
    )
    with pytest.raises(ConfigError) as err:
        resolve_config("smoke", cfg)
    assert "trajectory 5 has 5 time points and trajectory 0 6" in str(err.value)
    assert "np." not in str(err.value)


def test_declaring_is_a_step_before_validation_that_validation_only_reads(tmp_path) -> None:
    from datasets import SYSTEMS

    raw = {
        "profile": "smoke",
        "systems": ["lab_step"],
        "methods": ["node"],
        "define_systems": {"lab_step": {"file": str(_csv(tmp_path / "lab.csv", 40))}},
    }
    with pytest.raises(ValueError, match=r"'lab_step' .* not declared in this process"):
        RunConfig.model_validate(raw)
    assert "lab_step" not in SYSTEMS  # the failed validation declared nothing
    declared = declare_systems(raw)
    assert set(declared) == {"lab_step"} and SYSTEMS["lab_step"].default_trajectories == 40
    config = RunConfig.model_validate(raw, context={"declared": declared})
    assert config.cells()[0].data.source == declared["lab_step"]
    # a recorded config (a benchmark's run_config.json) read back in a process new to it
    from tasks.config import declarations as _declarations

    _declarations._DECLARED.clear()
    assert RunConfig.from_json(config.model_dump_json()).cells() == config.cells()


def test_a_split_of_fewer_than_four_trajectories_is_said_once_and_smoke_s_is_not(
    tmp_path, capsys
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'systems = ["tiny_lab", "integro_de"]\nmethods = ["node"]\n'
        f'[define_systems.tiny_lab]\nfile = "{_csv(tmp_path / "t.csv", 12)}"\n'
    )
    config = resolve_config("smoke", cfg)
    resolve_config("smoke", cfg)  # resolved again: said once
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "nllab: tiny_lab: its data split 10/1/1 trajectories (train/validation/test), fewer "
        "than 4 in a split; its models train but are never registered"
    ]
    assert config.split_sizes("integro_de") == (32, 4, 4)  # the smoke profile's 40
    assert config.small_split("integro_de") is None
    empty_train = {
        "systems": ["sine"],
        "data": {"n_trajectories": 10, "fractions": [0.1, 0.45, 0.45]},
    }
    with pytest.raises(ConfigError, match=r"config: sine: 10 trajectories are too few .* empty"):
        resolve_config("smoke", overrides=empty_train)


def test_register_names_methods_all_or_none() -> None:
    def registered(value) -> tuple[str, ...]:
        c = resolve_config("smoke", overrides={"tracking": {"register_methods": value}})
        return c.tracking.registered(c.methods)

    assert registered("node") == ("node",)
    assert registered(["node", "latent_ode"]) == ("node", "latent_ode")
    assert registered("all") == resolve_config("smoke").methods
    assert registered("none") == registered([]) == ()
    assert resolve_config("smoke").tracking.registered(("node", "neural_laplace")) == (
        "neural_laplace",
    )
    with pytest.raises(ConfigError, match=r"tracking\.register_methods: unknown method 'nodee'"):
        registered(["nodee"])


def test_run_benchmark_refuses_a_model_too_large_before_anything_starts(
    tmp_path, monkeypatch
) -> None:
    """The model-memory check meets a Python caller of run_benchmark, as the command's."""
    from flows.benchmark import run_benchmark
    from tasks.errors import SettingError

    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    wide = {"node": {"hidden": [65536, 65536, 65536]}}  # 10^10 weights: hundreds of GB
    config = resolve_config(
        "smoke", overrides={"systems": ["sine"], "methods": ["node"], "models": wide}
    )
    with pytest.raises(SettingError, match=r"node on sine: this model needs [\d,.]+ GB to train"):
        run_benchmark(config)
    assert not (tmp_path / "mlflow").exists()  # refused before the store was opened


def test_champions_are_the_best_of_each_registered_method_never_on_a_small_split(
    tmp_path,
) -> None:
    from flows.benchmark import champions
    from tasks.results import CellResult

    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'systems = ["tiny_lab", "integro_de"]\nmethods = ["node", "anode"]\nseeds = [0, 1]\n'
        f'[define_systems.tiny_lab]\nfile = "{_csv(tmp_path / "t.csv", 12)}"\n'
        '[tracking]\nregister_methods = ["node"]\n'
    )
    config = resolve_config("smoke", cfg)
    rmse = {"tiny_lab": 0.1, "integro_de": 0.5}
    results = [
        CellResult(c.system, c.method, c.seed, "finished", rmse[c.system] + c.seed, f"run{i}")
        for i, c in enumerate(config.cells())
    ]
    best = champions(results, config)
    # node only (as asked), seed 0 (the lower RMSE), integro_de only (tiny_lab splits 10/1/1)
    assert {k: r.seed for k, r in best.items()} == {("node", "integro_de"): 0}
