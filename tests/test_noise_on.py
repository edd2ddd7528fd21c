"""Observation noise after the z-score (``DataConfig.noise_on = "normalised"``), as the paper's
reference code adds it (``generate_data_set`` in its ``experiments/datasets.py``: the
trajectories are z-scored over every trajectory, ddof 1, then ``trajectories +=
torch.randn(trajectories.shape) * noise_std``, before the split, on observations and targets
alike), against an oracle computed here; and the default (``"raw"``, noise in physical units
before the z-score) leaves every data set, hash and fingerprint as it was."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from datasets import load_or_simulate, prepare, simulate
from tasks.config import CellConfig, DataConfig
from tasks.machine.numerics import data_settings, system_key
from tasks.pipeline import prepare_cell, simulate_data

SIGMA = 0.1
N, SEED = 40, 5


def _oracle_draws(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The data set's noise stream, drawn here: the second child of the seed's sequence (the
    first draws the initial conditions), one standard normal per value of the whole set."""
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1]).standard_normal(shape)


def _splits(p):
    return (p.train, p.val, p.test)


@pytest.mark.parametrize("normalise_on", ["all", "train"])
def test_noise_after_the_z_score_matches_the_oracle(normalise_on):
    clean = simulate("integro_de", n_trajectories=N, seed=SEED)
    ds = simulate("integro_de", n_trajectories=N, seed=SEED, noise_std=SIGMA, noise_on="normalised")
    # the data set itself is noise-free: the noise comes with the split
    assert ds.x.tobytes() == clean.x.tobytes() and ds.noise_on == "normalised"
    p = prepare(ds, seed=SEED, normalise_on=normalise_on, n_observed=60)

    # the statistics are the noise-free data's, of every trajectory (ddof 1) or of training's
    rows = slice(None) if normalise_on == "all" else p.train.index
    flat = clean.x[rows].reshape(-1, clean.state_dim)
    mean, std = flat.mean(0), flat.std(0, ddof=1 if normalise_on == "all" else 0)
    np.testing.assert_allclose(p.normaliser.mean, mean, rtol=1e-14, atol=0)
    np.testing.assert_allclose(p.normaliser.std, std, rtol=1e-14, atol=0)

    eps = _oracle_draws(SEED, clean.x.shape)
    z = (clean.x - mean) / std
    noisy = z + SIGMA * eps
    for s in _splits(p):
        np.testing.assert_allclose(s.obs_x, noisy[s.index, 40:100], rtol=0, atol=1e-12)
        np.testing.assert_allclose(s.target, noisy[s.index, 100:], rtol=0, atol=1e-12)
        np.testing.assert_allclose(s.target_clean, z[s.index, 100:], rtol=0, atol=1e-12)


def test_noise_is_sigma_in_normalised_units_where_raw_noise_is_not():
    """σ = 0.1 is a tenth of the z-scored scale after the z-score; before it, on the integro-DE
    (raw std about 0.17), it is more than half of it: the difference the option closes."""
    kwargs = {"n_trajectories": 100, "seed": 0, "noise_std": SIGMA}
    after = prepare(simulate("integro_de", noise_on="normalised", **kwargs), normalise_on="all")
    before = prepare(simulate("integro_de", noise_on="raw", **kwargs), normalise_on="all")

    def noise_std(p) -> float:
        return float(
            np.concatenate([(s.target - s.target_clean).ravel() for s in _splits(p)]).std()
        )

    assert abs(noise_std(after) - SIGMA) < 0.004  # 10 000 values: the std's own spread ~ 0.0007
    assert noise_std(before) > 0.4


def test_same_seed_same_bytes_another_seed_other_noise():
    def made(seed: int) -> list[bytes]:
        ds = simulate("lotka_volterra_dde", n_trajectories=20, seed=seed, noise_std=SIGMA,
                      noise_on="normalised")  # fmt: skip
        p = prepare(ds, seed=seed, normalise_on="all")
        return [a.tobytes() for s in _splits(p) for a in (s.obs_x, s.target)]

    assert made(3) == made(3)
    assert all(a != b for a, b in zip(made(3), made(4), strict=True))


def test_no_noise_has_nowhere_to_go_and_raw_is_the_default():
    plain = simulate("lotka_volterra_dde", n_trajectories=12, seed=1)
    moot = simulate("lotka_volterra_dde", n_trajectories=12, seed=1, noise_on="normalised")
    assert moot.fingerprint == plain.fingerprint and moot.noise_on == "raw"
    raw = simulate("lotka_volterra_dde", n_trajectories=12, seed=1, noise_std=SIGMA)
    after = simulate("lotka_volterra_dde", n_trajectories=12, seed=1, noise_std=SIGMA,
                     noise_on="normalised")  # fmt: skip
    assert raw.noise_on == "raw" and after.fingerprint != raw.fingerprint
    assert raw.x.tobytes() != plain.x.tobytes()  # raw noise is in the values, as before


def test_config_hashes_and_canary_settings_are_unchanged_unless_the_noise_moves():
    base = CellConfig(system="integro_de", method="neural_laplace", seed=0,
                      data=DataConfig(noise_std=SIGMA, normalise_on="all"))  # fmt: skip

    def data(**kw) -> CellConfig:
        return base.model_copy(update={"data": base.data.model_copy(update=kw)})

    assert "noise_on" not in base.canonical_json() and "data.noise_on" not in base.flat_params()
    assert "noise_on" not in data_settings(base)
    # no noise: the setting changes nothing, so neither the hash nor the data canary
    quiet, quiet_after = data(noise_std=0.0), data(noise_std=0.0, noise_on="normalised")
    assert quiet_after.config_hash() == quiet.config_hash()
    assert system_key(quiet_after) == system_key(quiet)
    after = data(noise_on="normalised")
    assert after.config_hash() != base.config_hash()
    assert data_settings(after)["noise_on"] == "normalised"
    assert system_key(after) != system_key(base)
    assert after.flat_params()["data.noise_on"] == "normalised"


def test_cache_and_pipeline_keep_the_setting(tmp_path):
    cell = CellConfig(system="lotka_volterra_dde", method="node", seed=2,
                      data=DataConfig(n_trajectories=20, noise_std=SIGMA, noise_on="normalised",
                                      normalise_on="all"))  # fmt: skip
    first = simulate_data(cell.system, cell.data, cell.seed, tmp_path)
    again = load_or_simulate("lotka_volterra_dde", 20, seed=2, noise_std=SIGMA,
                             cache_dir=tmp_path, noise_on="normalised")  # fmt: skip
    raw = load_or_simulate("lotka_volterra_dde", 20, seed=2, noise_std=SIGMA, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2  # one file each, under its own fingerprint
    assert again.noise_on == "normalised" and again.fingerprint == first.fingerprint
    assert raw.noise_on == "raw" and raw.x.tobytes() != again.x.tobytes()
    direct = prepare(simulate("lotka_volterra_dde", 20, seed=2, noise_std=SIGMA,
                              noise_on="normalised"), seed=2, normalise_on="all")  # fmt: skip
    p = prepare_cell(cell, again)
    assert p.fingerprint == direct.fingerprint
    assert p.test.target.tobytes() == direct.test.target.tobytes()


def test_bad_noise_settings_are_refused():
    with pytest.raises(ValueError, match="noise_on must be one of 'raw', 'normalised'"):
        simulate("lotka_volterra_dde", n_trajectories=12, noise_std=SIGMA, noise_on="physical")
    with pytest.raises(ValidationError, match="noise_on"):
        DataConfig(noise_std=SIGMA, noise_on="after")
    with pytest.raises(ValidationError, match="noise_std"):
        DataConfig(noise_std=-0.1, noise_on="normalised")
