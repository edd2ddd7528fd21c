"""Determinism, noise, splits, normalisation, cache, errors and plots of ``datasets``."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile

import numpy as np
import pytest
from matplotlib.figure import Figure
from scipy import stats

from datasets import (
    CacheError,
    Normaliser,
    data_home,
    load_or_simulate,
    plot_trajectories,
    prepare,
    simulate,
)


# --- determinism and seeds --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["spiral_dde", "lotka_volterra_dde", "integro_de", "noisy_sines"])
def test_same_seed_same_data(name):
    a = simulate(name, n_trajectories=20, n_points=30, seed=5, noise_std=0.1)
    b = simulate(name, n_trajectories=20, n_points=30, seed=5, noise_std=0.1)
    for f in ("t", "x", "x_clean", "ic", "t_physical"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64


def test_different_seeds_differ_where_they_should():
    # random initial histories (N != 961) depend on the seed ...
    a = simulate("spiral_dde", n_trajectories=50, n_points=20, seed=0)
    b = simulate("spiral_dde", n_trajectories=50, n_points=20, seed=1)
    assert not np.any(np.all(a.ic == b.ic, axis=1))
    assert np.all(np.abs(a.ic) <= 2) and a.fingerprint != b.fingerprint
    # ... while reference linspace initial conditions do not, only the noise does
    c = simulate("integro_de", n_trajectories=50, n_points=20, seed=0, noise_std=0.1)
    d = simulate("integro_de", n_trajectories=50, n_points=20, seed=1, noise_std=0.1)
    np.testing.assert_array_equal(c.ic, d.ic)
    np.testing.assert_array_equal(c.x_clean, d.x_clean)
    assert np.all(c.x != d.x)


def test_fingerprint_covers_every_input():
    base = {"n_trajectories": 10, "n_points": 20, "seed": 0, "noise_std": 0.0}
    prints = {simulate("sine", **base).fingerprint}
    for change in ({"n_trajectories": 11}, {"n_points": 21}, {"seed": 1}, {"noise_std": 0.01}):
        prints.add(simulate("sine", **{**base, **change}).fingerprint)
    prints.add(simulate("sawtooth", **base).fingerprint)
    assert len(prints) == 6


# --- noise ------------------------------------------------------------------------------------
def test_noise_statistics():
    sigma = 0.1
    ds = simulate("lotka_volterra_dde", n_trajectories=200, n_points=50, seed=2, noise_std=sigma)
    e = (ds.x - ds.x_clean).ravel()  # 20 000 draws
    assert abs(e.mean()) < 4 * sigma / math.sqrt(e.size)
    assert abs(e.std() / sigma - 1) < 0.03
    assert stats.kstest(e / sigma, "norm").pvalue > 1e-3
    # independent across time: lag-1 correlation near 0
    r = np.corrcoef(e.reshape(200, 50, 2)[:, :-1].ravel(), e.reshape(200, 50, 2)[:, 1:].ravel())[
        0, 1
    ]
    assert abs(r) < 0.05
    clean = simulate("lotka_volterra_dde", n_trajectories=200, n_points=50, seed=2)
    np.testing.assert_array_equal(clean.x, clean.x_clean)
    np.testing.assert_array_equal(clean.x_clean, ds.x_clean)


def test_noise_pattern_shared_across_sigmas():
    a = simulate("sine", n_trajectories=5, n_points=20, seed=3, noise_std=0.01)
    b = simulate("sine", n_trajectories=5, n_points=20, seed=3, noise_std=0.1)
    np.testing.assert_allclose((b.x - b.x_clean), 10 * (a.x - a.x_clean), rtol=1e-9, atol=1e-12)


# --- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"system": "spiral"}, "unknown system 'spiral'.*spiral_dde"),
        ({"n_trajectories": 0}, "n_trajectories must be >= 1"),
        ({"n_trajectories": 2.5}, "n_trajectories must be an integer"),
        ({"n_points": 3}, "n_points must be >= 4"),
        ({"noise_std": -0.1}, "noise_std"),
        ({"noise_std": float("nan")}, "noise_std"),
        ({"noise_std": "abc"}, "noise_std"),
        ({"seed": -1}, "seed must be >= 0"),
    ],
)
def test_bad_arguments_raise_clear_value_errors(kwargs, match):
    args = {"system": "sine", "n_trajectories": 4, "n_points": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        simulate(**args)
    with pytest.raises(ValueError, match=match):
        load_or_simulate(**args, cache_dir="/nonexistent-never-created")


# --- prepare ----------------------------------------------------------------------------------
def test_prepare_split_sizes_disjoint_and_seeded():
    ds = simulate("spiral_dde", n_trajectories=100, n_points=20, noise_std=0.01)
    p = prepare(ds, seed=4)
    assert (p.train.n, p.val.n, p.test.n) == (80, 10, 10)
    idx = np.concatenate([p.train.index, p.val.index, p.test.index])
    assert sorted(idx.tolist()) == list(range(100))
    q = prepare(ds, seed=4)
    np.testing.assert_array_equal(p.test.index, q.test.index)
    assert p.fingerprint == q.fingerprint
    r = prepare(ds, seed=5)
    assert not np.array_equal(p.test.index, r.test.index) and r.fingerprint != p.fingerprint
    s = prepare(ds, fractions=(0.6, 0.2, 0.2))
    assert (s.train.n, s.val.n, s.test.n) == (60, 20, 20)


def test_prepare_windows_and_values():
    ds = simulate("lotka_volterra_dde", n_trajectories=30, n_points=21, noise_std=0.05)
    p = prepare(ds)  # T = 21: observed 10 points, predicted the last 11
    tr = p.train
    np.testing.assert_array_equal(tr.obs_t, ds.t[:10])
    np.testing.assert_array_equal(tr.query_t, ds.t[10:])
    assert tr.obs_x.shape == (tr.n, 10, 2) and tr.target.shape == tr.target_clean.shape == (
        tr.n,
        11,
        2,
    )
    nm = p.normaliser
    np.testing.assert_allclose(nm.inverse_transform(tr.obs_x), ds.x[tr.index, :10])
    np.testing.assert_allclose(nm.inverse_transform(tr.target), ds.x[tr.index, 10:])
    np.testing.assert_allclose(
        nm.inverse_transform(p.test.target_clean), ds.x_clean[p.test.index, 10:]
    )
    np.testing.assert_array_equal(p.val.ic, ds.ic[p.val.index])
    # observation-size study: fewer observed points, right before the same prediction window
    q = prepare(ds, n_observed=3)
    np.testing.assert_array_equal(q.train.obs_t, ds.t[7:10])
    np.testing.assert_array_equal(q.train.query_t, tr.query_t)
    np.testing.assert_array_equal(q.test.target, p.test.target)


def test_normalisation_uses_training_statistics_only():
    ds = simulate("spiral_dde", n_trajectories=50, n_points=20, noise_std=0.01)
    p = prepare(ds, seed=1)
    train = ds.x[p.train.index].reshape(-1, 2)
    np.testing.assert_allclose(p.normaliser.mean, train.mean(0))
    np.testing.assert_allclose(p.normaliser.std, train.std(0))
    flat = np.concatenate([p.train.obs_x, p.train.target], axis=1).reshape(-1, 2)
    np.testing.assert_allclose(flat.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(flat.std(0), 1, atol=1e-12)
    # corrupting val/test rows leaves the statistics unchanged
    x = np.array(ds.x)
    x[np.concatenate([p.val.index, p.test.index])] += 100.0
    ds2 = dataclasses.replace(ds, x=x)
    p2 = prepare(ds2, seed=1)
    np.testing.assert_array_equal(p2.normaliser.mean, p.normaliser.mean)
    np.testing.assert_array_equal(p2.normaliser.std, p.normaliser.std)


def test_normalise_on_all_uses_every_trajectory_with_ddof_1():
    ds = simulate("lotka_volterra_dde", n_trajectories=50, n_points=20, noise_std=0.01)
    p = prepare(ds, seed=1, normalise_on="all")
    flat = np.asarray(ds.x).reshape(-1, 2)
    np.testing.assert_allclose(p.normaliser.mean, np.mean(flat, axis=0), rtol=1e-13)
    np.testing.assert_allclose(p.normaliser.std, np.std(flat, axis=0, ddof=1), rtol=1e-13)
    assert p.normalise_on == "all"
    # the pooled normalised data (every split, both halves) has mean 0 and ddof-1 std 1
    whole = np.concatenate(
        [
            np.concatenate([s.obs_x, s.target], axis=1).reshape(-1, 2)
            for s in (p.train, p.val, p.test)
        ]
    )
    np.testing.assert_allclose(whole.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(whole.std(0, ddof=1), 1, atol=1e-12)
    # the split itself and the train mode are unchanged; the fingerprints tell them apart
    t = prepare(ds, seed=1)
    np.testing.assert_array_equal(t.test.index, p.test.index)
    assert t.normalise_on == "train" and t.fingerprint != p.fingerprint
    assert not np.allclose(t.normaliser.std, p.normaliser.std)
    with pytest.raises(ValueError, match="normalise_on must be one of 'train', 'all'"):
        prepare(ds, normalise_on="val")


def test_sample_size_study_nested_and_fixed_eval_sets():
    ds = simulate("lotka_volterra_dde", n_trajectories=100, n_points=10)
    full = prepare(ds, seed=2)
    subs = {k: prepare(ds, seed=2, n_train=k) for k in (62, 30)}
    for k, p in subs.items():
        assert p.train.n == k and set(p.train.index) <= set(full.train.index)
        np.testing.assert_array_equal(p.val.index, full.val.index)
        np.testing.assert_array_equal(p.test.index, full.test.index)
        np.testing.assert_allclose(p.normaliser.mean, ds.x[p.train.index].reshape(-1, 2).mean(0))
    assert set(subs[30].train.index) <= set(subs[62].train.index)


def test_normaliser_torch_and_round_trip():
    torch = pytest.importorskip("torch")
    nm = Normaliser(mean=np.array([1.0, -2.0]), std=np.array([2.0, 0.5]))
    x = np.array([[[3.0, -1.0]]])
    np.testing.assert_allclose(nm.transform(x), [[[1.0, 2.0]]])
    xt = torch.tensor(x, dtype=torch.float32)
    yt = nm.transform(xt)
    assert isinstance(yt, torch.Tensor) and yt.dtype == torch.float32
    np.testing.assert_allclose(nm.inverse_transform(yt).numpy(), x)
    back = Normaliser.from_dict(nm.to_dict())
    np.testing.assert_array_equal(back.mean, nm.mean)
    np.testing.assert_array_equal(back.std, nm.std)
    with pytest.raises(ValueError, match="std"):
        Normaliser(mean=np.zeros(2), std=np.array([1.0, 0.0]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fractions": (0.8, 0.1)}, "fractions"),
        ({"fractions": (0.8, 0.1, 0.2)}, "sum to 1"),
        ({"fractions": (0.9, -0.1, 0.2)}, "fractions"),
        ({"n_observed": 0}, r"n_observed must be an integer in \[1, 5\]"),
        ({"n_observed": 6}, r"n_observed must be an integer in \[1, 5\]"),
        ({"n_train": 9}, r"n_train must be an integer in \[1, 8\]"),
        ({"seed": -3}, "seed"),
    ],
)
def test_prepare_bad_arguments(kwargs, match):
    ds = simulate("sine", n_trajectories=10, n_points=10)
    with pytest.raises(ValueError, match=match):
        prepare(ds, **kwargs)


def test_prepare_too_few_trajectories():
    with pytest.raises(ValueError, match="training split would be empty"):
        prepare(simulate("sine", n_trajectories=2, n_points=10))


# --- cache ------------------------------------------------------------------------------------
def test_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))
    assert data_home() == tmp_path
    monkeypatch.delenv("NLLAB_HOME")
    assert data_home().name == ".nllab" and data_home().parent == data_home().home()


def test_cache_hit_identical_and_default_location(monkeypatch, tmp_path):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))
    kw = {"n_trajectories": 12, "n_points": 16, "seed": 3, "noise_std": 0.05}
    fresh = simulate("spiral_dde", **kw)
    first = load_or_simulate("spiral_dde", **kw)
    files = list((tmp_path / "cache").glob("*.npz"))
    assert len(files) == 1 and fresh.fingerprint[:32] in files[0].name
    mtime = files[0].stat().st_mtime_ns
    second = load_or_simulate("spiral_dde", **kw)
    assert files[0].stat().st_mtime_ns == mtime  # read, not rewritten
    for f in ("t", "x", "x_clean", "ic", "t_physical"):
        np.testing.assert_array_equal(getattr(second, f), getattr(fresh, f))
        np.testing.assert_array_equal(getattr(first, f), getattr(fresh, f))
    assert (second.seed, second.noise_std, second.fingerprint) == (3, 0.05, fresh.fingerprint)
    assert not second.x.flags.writeable
    assert not list((tmp_path / "cache").glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupted_cache_is_detected_and_regenerated(tmp_path, caplog, damage):
    kw = {"n_trajectories": 8, "n_points": 12, "seed": 1, "cache_dir": tmp_path}
    good = load_or_simulate("lotka_volterra_dde", **kw)
    (path,) = tmp_path.glob("*.npz")
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # change one stored value in place: still a valid zip, wrong checksum
        import io
        import zipfile

        buf = io.BytesIO()
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["x"] = arrays["x"].copy()
        arrays["x"][0, 0, 0] += 1e-9
        np.savez(buf, **arrays)
        path.write_bytes(buf.getvalue())
        assert zipfile.is_zipfile(path)
    else:
        path.write_bytes(b"not a cache file")
    with caplog.at_level(logging.WARNING, logger="datasets"):
        again = load_or_simulate("lotka_volterra_dde", **kw)
    assert any("corrupted" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(again.x, good.x)
    # the regenerated file is good again: next read is silent
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="datasets"):
        load_or_simulate("lotka_volterra_dde", **kw)
    assert not caplog.records


def test_unwritable_cache_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match="not writable"):
        load_or_simulate("sine", n_trajectories=3, n_points=8, cache_dir=blocker / "cache")


def test_unwritable_cache_dir_keeps_a_good_file(tmp_path, monkeypatch):
    kw = {"n_trajectories": 3, "n_points": 8, "cache_dir": tmp_path}
    good = load_or_simulate("sine", **kw)
    (path,) = tmp_path.glob("*.npz")
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # a hit never writes, so it works from a read-only folder
    monkeypatch.setattr(tempfile, "mkstemp", fail)
    monkeypatch.setattr(tempfile, "TemporaryFile", fail)
    np.testing.assert_array_equal(load_or_simulate("sine", **kw).x, good.x)
    with pytest.raises(CacheError, match="not writable"):
        load_or_simulate("sine", **{**kw, "seed": 9})
    assert path.read_bytes() == before


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(CacheError, match="could not write"):
        load_or_simulate("sine", n_trajectories=3, n_points=8, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


# --- plots ------------------------------------------------------------------------------------
def test_plot_trajectories():
    ds = simulate("noisy_sines", n_trajectories=10, n_points=40)
    fig = plot_trajectories(ds, n=3)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    lines = fig.axes[0].get_lines()
    observed = [ln for ln in lines if ln.get_marker() == "o"]
    assert len(observed) == 3 and all(len(ln.get_xdata()) == 20 for ln in observed)
    fig2 = plot_trajectories(
        simulate("spiral_dde", n_trajectories=5, n_points=40), n=2, n_observed=5
    )
    assert len(fig2.axes) == 2
    assert all(
        len(ln.get_xdata()) == 5 for ln in fig2.axes[0].get_lines() if ln.get_marker() == "o"
    )
    with pytest.raises(ValueError, match="n_observed"):
        plot_trajectories(ds, n_observed=21)


def test_a_split_from_trajectories_observes_the_first_points():
    from datasets import SplitData

    t = np.linspace(0.0, 1.0, 5)
    x = np.arange(3 * 5 * 2, dtype=np.float64).reshape(3, 5, 2)
    s = SplitData.from_trajectories(t, x, 2)
    assert np.array_equal(s.obs_t, t[:2]) and np.array_equal(s.query_t, t[2:])
    assert np.array_equal(s.obs_x, x[:, :2]) and np.array_equal(s.target, x[:, 2:])
    assert np.array_equal(s.target_clean, s.target) and np.array_equal(s.ic, x[:, 0])
    assert s.n == 3 and np.array_equal(s.index, [0, 1, 2])
