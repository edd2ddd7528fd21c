"""Config resolution: defaults ← profile ← file ← flags, validation messages, the cell hash."""

from __future__ import annotations

import json

import pytest

from nlmodels.model_registry import model_arguments
from tasks.config import (
    BUILTIN_METHODS,
    MAIN_SYSTEMS,
    METHODS,
    PAPER_METHODS,
    PROFILES,
    QUICK_EPOCHS,
    SYSTEM_NAMES,
    CellConfig,
    ConfigError,
    DataConfig,
    TrainConfig,
    load_config_file,
    profile_file,
    resolve_config,
)


def test_profiles_set_their_sizes():
    smoke, quick, paper = (resolve_config(p) for p in ("smoke", "quick", "paper"))
    assert quick.profile == "quick" and quick.seeds == (0,)
    assert quick.systems == MAIN_SYSTEMS and quick.methods == METHODS
    assert len(quick.cells()) == 6 * 9  # the paper's six models and the three peers
    assert paper.seeds == (0, 1, 2, 3, 4) and paper.data.n_trajectories == 1000
    assert paper.training.epochs == 1000 and paper.training.patience is None  # as the code
    assert paper.training.lr == 1e-3 and paper.training.batch_size == 128
    assert paper.training.grad_clip == 1.0 and paper.training.dtype == "float64"
    # quick: a fixed number of epochs per model (about equal time on the reference machine,
    # a faster model trains more), no wall-clock budget, so any machine gets the same table
    assert quick.training.max_train_seconds is None
    assert paper.training.max_train_seconds is None
    epochs = {c.method: c.training.epochs for c in quick.cells()}
    assert epochs == QUICK_EPOCHS and set(QUICK_EPOCHS) == set(METHODS)
    assert epochs["neural_laplace"] > epochs["node"] == epochs["anode"] > epochs["latent_ode"]
    assert epochs["latent_ode"] > epochs["nf_coupling"] == epochs["nf_resnet"]
    assert all(smoke.training.epochs < n < paper.training.epochs for n in epochs.values())
    # the paper's budget trains the paper's Table 3 unless models are named
    assert paper.methods == PAPER_METHODS and len(paper.cells()) == 6 * 6 * 5
    assert resolve_config("paper", overrides={"methods": ["lno"]}).methods == ("lno",)
    # the paper profile runs the Latent ODE and the Neural Flows as the reference code does; the
    # others, and the other profiles, as published
    reference = {"z0_time": "first_query", "kl_average": "latents"}
    sampled = {"predict": "sample", "select": "val_loss"}  # the reference's scoring
    assert dict(paper.models["latent_ode"]) == {**reference, **sampled}
    fair = resolve_config("fair")  # the paper's budget, the baselines on Neural Laplace's terms
    assert dict(fair.models["latent_ode"]) == reference and "node" not in fair.models
    assert (fair.seeds, fair.training, fair.data) == (paper.seeds, paper.training, paper.data)
    for ode in ("node", "anode"):
        assert dict(paper.models[ode]) == {"start": "first_query", "adjoint": True}
    for flow in ("nf_coupling", "nf_resnet"):
        assert dict(paper.models[flow]) == {"time_net": "linear"}
    assert not {"latent_ode", "nf_coupling", "nf_resnet"} & {*quick.models, *smoke.models}


def test_layers_apply_in_order(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(
        'profile = "paper"\nseeds = [7, 8]\n[training]\nepochs = 50\n'
        "[models.neural_laplace]\nlatent_dim = 4\n"
    )
    c = resolve_config(config_file=f)
    assert c.profile == "paper"  # from the file
    assert c.seeds == (7, 8) and c.training.epochs == 50  # file over profile
    assert (
        c.training.patience is None
    )  # the profile's, not the class default, where the file is silent
    c = resolve_config("smoke", f, {"seeds": [3], "training": {"epochs": 5}})
    assert c.profile == "smoke"  # flag over file
    assert c.seeds == (3,) and c.training.epochs == 5  # flags over file
    assert c.training.batch_size == 16  # smoke profile value survives
    cell = next(x for x in c.cells() if x.method == "neural_laplace")
    assert cell.model == {"latent_dim": 4}
    assert next(x for x in c.cells() if x.method == "node").model == {}


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_json_and_yaml_files(tmp_path, suffix):
    f = tmp_path / f"c{suffix}"
    data = {"systems": ["integro_de"], "training": {"epochs": 3}}
    f.write_text(json.dumps(data))  # JSON is valid YAML too
    c = resolve_config("smoke", f)
    assert c.systems == ("integro_de",) and c.training.epochs == 3


def test_unknown_names_list_valid_choices():
    with pytest.raises(ConfigError) as e:
        resolve_config("smoke", overrides={"systems": ["spiral"], "methods": ["nl"]})
    msg = str(e.value)
    assert "unknown system 'spiral'" in msg and "spiral_dde" in msg
    assert "unknown method 'nl'" in msg and "neural_laplace" in msg
    assert "'spiral' (did you mean 'spiral_dde'?)" in msg
    with pytest.raises(ConfigError, match=r"^invalid configuration: methods: .*'nod' \(did you"):
        resolve_config("smoke", overrides={"methods": ["nod"]})  # one problem: one line
    with pytest.raises(ConfigError, match="valid profiles: smoke, quick, paper"):
        resolve_config("fast")


def test_bad_values_and_unknown_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"training.epochs: .*greater than or equal to 1"):
        resolve_config("smoke", overrides={"training": {"epochs": 0}})
    with pytest.raises(ConfigError, match=r"training.learning_rate: unknown setting"):
        resolve_config("smoke", overrides={"training": {"learning_rate": 0.1}})
    with pytest.raises(ConfigError, match="sum to 1"):
        resolve_config("smoke", overrides={"data": {"fractions": [0.5, 0.1, 0.1]}})
    with pytest.raises(ConfigError, match="seeds"):
        resolve_config("smoke", overrides={"seeds": [1, 1]})
    bad = tmp_path / "c.toml"
    bad.write_text("seeds = [0,\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve_config(config_file=bad)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_config(config_file=tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"unknown format '\.ini'"):
        (tmp_path / "c.ini").write_text("x")
        resolve_config(config_file=tmp_path / "c.ini")


def test_config_hash_is_stable_and_sensitive():
    a = CellConfig(system="integro_de", method="node", seed=0)
    same = CellConfig(
        system="integro_de", method="node", seed=0, data=DataConfig(), training=TrainConfig()
    )
    assert a.config_hash() == same.config_hash()
    assert len(a.config_hash()) == 64
    # Known value: a change to the canonical form must be deliberate (bump _HASH_SCHEMA).
    assert a.canonical_json().startswith('{"data":{"fractions":[0.8,0.1,0.1]')
    variants = [
        a.model_copy(update={"seed": 1}),
        a.model_copy(update={"method": "anode"}),
        a.model_copy(update={"training": TrainConfig(epochs=999)}),
        a.model_copy(update={"data": DataConfig(noise_std=0.01)}),
        a.model_copy(update={"model": {"latent_dim": 4}}),
        a.model_copy(update={"data": DataConfig(normalise_on="all")}),
    ]
    assert len({v.config_hash() for v in variants} | {a.config_hash()}) == 7
    # the default normalisation leaves the canonical form (and old hashes) as they were
    assert "normalise_on" not in a.canonical_json()


def test_paper_profile_normalises_like_the_reference_code():
    assert {c.data.normalise_on for c in resolve_config("paper").cells()} == {"all"}
    for profile in ("smoke", "quick"):
        assert {c.data.normalise_on for c in resolve_config(profile).cells()} == {"train"}
    with pytest.raises(ConfigError, match="normalise_on"):
        resolve_config("quick", overrides={"data": {"normalise_on": "test"}})
    # the cell's setting reaches the split
    from datasets import simulate
    from tasks.cell import prepare_cell

    ds = simulate("integro_de", n_trajectories=20, n_points=10)
    paper_cell = resolve_config("paper", overrides={"systems": ["integro_de"]}).cells()[0]
    assert prepare_cell(paper_cell, ds).normalise_on == "all"
    assert prepare_cell(paper_cell.model_copy(update={"data": DataConfig()}), ds).normalise_on == (
        "train"
    )


def test_device_and_profile_do_not_change_cell_hashes():
    cpu = resolve_config("smoke", overrides={"device": "cpu"}).cells()
    auto = resolve_config("smoke", overrides={"device": "auto", "max_workers": 1}).cells()
    assert [c.config_hash() for c in cpu] == [c.config_hash() for c in auto]


def test_flat_params_cover_every_setting():
    p = CellConfig(system="integro_de", method="node", seed=2, model={"hidden": (8,)}).flat_params()
    assert p["seed"] == "2" and p["training.lr"] == "0.001" and p["model.hidden"] == "[8]"
    assert p["data.fractions"] == "[0.8, 0.1, 0.1]"
    assert p["training.patience"] == "100"


def test_model_overrides_are_checked_against_the_constructor():
    with pytest.raises(ConfigError, match=r"unknown node setting 'hiden'; valid: hidden, "):
        resolve_config("smoke", overrides={"models": {"node": {"hiden": (8,)}}})
    # ANODE forwards **kwargs to NODE: the base's arguments are valid too.
    assert model_arguments("anode")[:2] == ("augment_dim", "hidden")
    resolve_config("smoke", overrides={"models": {"anode": {"hidden": (8,), "solver": "rk4"}}})
    with pytest.raises(ValueError, match="unknown neural_laplace setting 'latent'"):
        CellConfig(system="integro_de", method="neural_laplace", seed=0, model={"latent": 2})


def test_model_overrides_with_a_fixed_set_of_values_are_checked_at_config_time():
    with pytest.raises(ConfigError, match=r"latent_ode setting 'z0_time' must be one of "
                       r"'first_observed', 'first_query', got 'first'"):  # fmt: skip
        resolve_config("paper", overrides={"models": {"latent_ode": {"z0_time": "first"}}})
    ok = resolve_config("smoke", overrides={"models": {"latent_ode": {"kl_average": "latents"}}})
    assert ok.models["latent_ode"]["kl_average"] == "latents"


@pytest.mark.parametrize(
    "method", sorted(m for m in BUILTIN_METHODS if "ilt" in model_arguments(m))
)
def test_every_ilt_a_config_admits_for_a_model_builds_it_and_no_other(method):
    """An ILT a model cannot take (Laplace-Net reads x through a linear ILT's weights) is refused
    when the config is read, naming the ones it can; every one the config admits builds."""
    from nlmodels import build_model
    from nlmodels.ilt import ILT_ALGORITHMS
    from nlmodels.model_registry import registry_choices

    admitted = registry_choices(method)["ilt"]
    for name in sorted(ILT_ALGORITHMS):
        overrides = {"methods": [method], "models": {method: {"ilt": name}}}
        if name in admitted:
            resolve_config("smoke", overrides=overrides)
            build_model(method, 2, ilt=name)
        else:
            with pytest.raises(ConfigError, match=rf"'ilt' must be one of .*got '{name}'"):
                resolve_config("smoke", overrides=overrides)
            with pytest.raises(ValueError, match="linear ILT"):
                build_model(method, 2, ilt=name)


def test_pack_is_outside_the_cell_hash():
    on = resolve_config("smoke", overrides={"pack": True})
    off = resolve_config("smoke", overrides={"pack": False})
    assert [c.config_hash() for c in on.cells()] == [c.config_hash() for c in off.cells()]


def test_an_override_equal_to_the_default_is_the_same_cell():
    def cell(method, **model):
        return CellConfig(system="integro_de", method=method, seed=0, model=model)

    plain = cell("neural_laplace")
    assert cell("neural_laplace", stereographic=True).config_hash() == plain.config_hash()
    assert cell("neural_laplace", stereographic=False).config_hash() != plain.config_hash()
    assert cell("node", hidden=(128, 128)).config_hash() == cell("node").config_hash()
    assert cell("node", hidden=(128, 64)).config_hash() != cell("node").config_hash()


def test_execution_settings_are_apart_from_the_experiment(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('profile = "paper"\n[execution]\nmax_workers = 8\npack = false\n')
    cfg = resolve_config(None, f)
    # the file's [execution] table beats the profile (4 workers); flags beat the file
    assert cfg.execution.max_workers == 8 and cfg.execution.pack is False
    assert resolve_config(None, f, {"max_workers": 3}).execution.max_workers == 3
    # the old spelling, at the top level, means the same
    top = tmp_path / "top.toml"
    top.write_text('profile = "paper"\nmax_workers = 8\n')
    assert resolve_config(None, top).execution.max_workers == 8
    experiment = json.loads(cfg.experiment_json())
    assert "execution" not in experiment and "max_workers" not in experiment
    assert experiment["seeds"] == [0, 1, 2, 3, 4]
    # how it executes never changes what a cell is
    fast = resolve_config(None, f, {"max_workers": 1, "device": "cpu", "torch_threads": 2})
    assert [c.config_hash() for c in fast.cells()] == [c.config_hash() for c in cfg.cells()]


def test_quick_epochs_give_way_to_explicit_epochs(tmp_path):
    """An epoch count from a file or a flag applies to every method; the profile's per-method
    counts stay where nothing else is said (and leave the other profiles' cells alone)."""
    flag = resolve_config("quick", None, {"training": {"epochs": 7}})
    assert {c.training.epochs for c in flag.cells()} == {7} and flag.method_epochs == {}
    f = tmp_path / "e.toml"
    f.write_text("[training]\nepochs = 9\n")
    assert {c.training.epochs for c in resolve_config("quick", f).cells()} == {9}
    budget = resolve_config("quick", None, {"training": {"max_train_seconds": 5.0}})
    assert {c.method: c.training.epochs for c in budget.cells()} == QUICK_EPOCHS
    assert {c.training.max_train_seconds for c in budget.cells()} == {5.0}
    own = resolve_config("smoke", None, {"method_epochs": {"node": 3}})
    assert {c.method: c.training.epochs for c in own.cells()}["node"] == 3
    assert resolve_config("paper").method_epochs == {}
    with pytest.raises(ConfigError, match="unknown method 'nod'"):
        resolve_config("quick", None, {"method_epochs": {"nod": 3}})
    with pytest.raises(ConfigError, match="at least 1"):
        resolve_config("quick", None, {"method_epochs": {"node": 0}})


def test_name_lists_known_without_numpy_match_the_registries():
    """The command line checks names from these lists before numpy or torch load."""
    from datasets import SYSTEMS
    from nlmodels import MODELS

    assert set(SYSTEM_NAMES) == set(SYSTEMS) and list(SYSTEM_NAMES) == sorted(SYSTEM_NAMES)
    # the built-in registry (plugins installed beside the platform register theirs on use);
    # the main table's rows are some of them (models.toml's main_table)
    builtin = {n for n, c in MODELS.items() if c.__module__.startswith("nlmodels.")}
    assert set(BUILTIN_METHODS) == builtin and set(METHODS) <= builtin


@pytest.mark.parametrize(
    ("toml", "line"),
    [
        ('[models.node]\nhidden = "128"', "node setting 'hidden' must be a list of integers"),
        ("[models.node]\nhidden = 128", "node setting 'hidden' must be a list of integers"),
        ("[training]\nepochs = true", "training.epochs: must be an integer, got true"),
        ('[training]\nlr = "1e-3"', 'training.lr: must be a number, got "1e-3"'),
        ('[models.neural_laplace]\nlatent_dim = "4"', "'latent_dim' must be an integer, got \"4\""),
        ("[models.neural_laplace]\nlatent_dim = -1", "'latent_dim' must be at least 1, got -1"),
        ('[models.node]\nsolver = "eular"', "node setting 'solver' must be one of 'euler'"),
        ('[models.neural_laplace]\nilt = "talbott"', "'ilt' must be one of 'cme', 'dehoog'"),
        ("[models.node]\nadjoint = 1", "node setting 'adjoint' must be true or false, got 1"),
        ("[models.node]\nrtol = 0", "node setting 'rtol' must be positive, got 0"),
        ("[models.anode]\naugment_dim = 0", "anode setting 'augment_dim' must be at least 1"),
        ("[data]\nfractions = [0.8, 0.1, true]", "data.fractions: item 3 must be a number"),
        ('pack = "yes"', 'execution.pack: must be true or false, got "yes"'),
        ("seeds = [0, true]", "seeds: item 2 must be an integer, got true"),
    ],
)
def test_values_of_the_wrong_kind_or_range_are_refused_with_one_line(tmp_path, toml, line):
    cfg = tmp_path / "run.toml"
    cfg.write_text(toml + "\n")
    with pytest.raises(ConfigError) as err:
        resolve_config("smoke", cfg, {})
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("invalid configuration: "), lines
    assert line in lines[0]


def test_every_bad_model_option_is_its_own_line_and_valid_ones_still_pass():
    bad = {"node": {"hidden": "8", "solver": "eular"}, "neural_laplace": {"latent_dim": 0}}
    with pytest.raises(ConfigError) as err:
        resolve_config("smoke", overrides={"models": bad})
    assert len(str(err.value).splitlines()) == 4
    good = {
        "node": {"hidden": [8, 8], "solver": "rk4", "rtol": 1e-4, "augment_dim": 0},
        "neural_laplace": {"ilt": "talbot", "latent_dim": 4, "max_frequency": 2, "terms": 17},
        "latent_ode": {"obs_std": 1, "encoder_steps": 2},  # an integer is a number
    }
    cfg = resolve_config("smoke", overrides={"models": good, "data": {"n_trajectories": 2e3}})
    assert cfg.models["node"]["hidden"] == (8, 8) and cfg.data.n_trajectories == 2000
    # the tuned path validates through the cell config alike
    with pytest.raises(ValueError, match="node setting 'hidden' must be a list of integers"):
        CellConfig(system="integro_de", method="node", seed=0, model={"hidden": "64"})


def test_seeds_beyond_32_bits_are_refused():
    with pytest.raises(ConfigError, match="distinct non-negative integers up to 4294967295"):
        resolve_config("smoke", overrides={"seeds": [99999999999999999999]})
    assert resolve_config("smoke", overrides={"seeds": [2**32 - 1]}).seeds == (2**32 - 1,)


def test_an_experiment_name_longer_than_mlflow_allows_is_a_config_error():
    with pytest.raises(ConfigError, match=r"tracking\.experiment: String should have at most 500"):
        resolve_config("smoke", overrides={"tracking": {"experiment": "x" * 501}})


@pytest.mark.parametrize("profile", PROFILES)
def test_a_shipped_profile_is_a_config_file_that_gives_its_cells(profile, tmp_path):
    """Each profile is a config file the package ships: it reads through the same loader as a
    user's file, and ``--config`` of a copy of it gives the cells ``--profile`` gives."""
    import shutil

    path = profile_file(profile)
    assert path.is_file() and path.read_text().lstrip().startswith("#")  # explained inside
    layer = load_config_file(path)
    assert layer["profile"] == profile
    copy = shutil.copy(path, tmp_path / path.name)
    by_file, by_name = resolve_config(config_file=copy), resolve_config(profile)
    assert by_file == by_name
    assert [c.config_hash() for c in by_file.cells()] == [c.config_hash() for c in by_name.cells()]


def test_the_shipped_profiles_are_the_profiles():
    shipped = profile_file(PROFILES[0]).parent.glob("*.yaml")
    assert sorted(p.stem for p in shipped) == sorted(PROFILES)
    assert QUICK_EPOCHS == load_config_file(profile_file("quick"))["method_epochs"]
