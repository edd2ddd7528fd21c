"""Train/validation/test split, observed/predicted windows and normalisation.

Windows: observed half = first T//2 points, predicted half = last T - T//2 points; the
observation-size study varies only the number of observed points (those right before the
prediction window), the sample-size study sub-samples the training split, and per-dimension
z-scores are fitted on the training split only (or on every trajectory).  A data set simulated
with ``noise_on="normalised"`` gets its observation noise here, after the z-score.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from datasets._simulate import Dataset, check_int, noise_draws, read_only

#: Where :func:`prepare` takes its normalisation statistics from.
NORMALISE_ON: tuple[str, ...] = ("train", "all")

_MIN_STD = 1e-12  # a constant dimension keeps std 1 instead of dividing by ~0


@dataclass(frozen=True, eq=False)
class Normaliser:
    """Per-dimension z-score ``(x - mean) / std``; works on numpy arrays and torch tensors.

    Attributes:
        mean: ``[D]`` float64.
        std: ``[D]`` float64, > 0.
    """

    mean: np.ndarray
    std: np.ndarray

    def __post_init__(self) -> None:
        mean = np.asarray(self.mean, dtype=np.float64)
        std = np.asarray(self.std, dtype=np.float64)
        if mean.ndim != 1 or mean.shape != std.shape:
            raise ValueError(
                f"mean and std must be 1-D of equal length, got {mean.shape}, {std.shape}"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError("mean must be finite and std finite and > 0")
        object.__setattr__(self, "mean", read_only(mean))
        object.__setattr__(self, "std", read_only(std))

    def _params(self, x: Any) -> tuple[Any, Any]:
        if type(x).__module__.split(".")[0] == "torch":  # avoid importing torch for numpy users
            import torch

            # np.array copies: torch refuses to wrap the read-only arrays without a warning
            return (
                torch.as_tensor(np.array(self.mean), dtype=x.dtype, device=x.device),
                torch.as_tensor(np.array(self.std), dtype=x.dtype, device=x.device),
            )
        return self.mean, self.std

    def transform(self, x: Any) -> Any:
        """Physical units -> normalised; the last axis is the state dimension."""
        mean, std = self._params(x)
        return (x - mean) / std

    def inverse_transform(self, x: Any) -> Any:
        """Normalised -> physical units (maps model predictions back)."""
        mean, std = self._params(x)
        return x * std + mean

    def to_dict(self) -> dict[str, list[float]]:
        """JSON-ready form for logging."""
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Sequence[float]]) -> Normaliser:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(d, dict) or set(d) != {"mean", "std"}:
            raise ValueError(f"expected a dict with keys 'mean' and 'std', got {d!r}")
        return cls(mean=np.asarray(d["mean"]), std=np.asarray(d["std"]))


@dataclass(frozen=True, eq=False)
class SplitData:
    """One split, normalised, float64 numpy.

    Attributes:
        obs_t: ``[T_o]`` observed times. obs_x: ``[n, T_o, D]`` observed (noisy) values.
        query_t: ``[T_q]`` prediction times. target: ``[n, T_q, D]`` values to predict (noisy).
        target_clean: ``[n, T_q, D]`` noise-free values to predict.
        index: ``[n]`` rows of the source ``Dataset``. ic: ``[n, k]`` their initial conditions.
    """

    obs_t: np.ndarray
    obs_x: np.ndarray
    query_t: np.ndarray
    target: np.ndarray
    target_clean: np.ndarray
    index: np.ndarray
    ic: np.ndarray

    @property
    def n(self) -> int:
        return self.index.shape[0]

    @classmethod
    def from_trajectories(cls, t: np.ndarray, x: np.ndarray, n_observed: int) -> SplitData:
        """Trajectories ``x`` ``[n, T, D]`` on one grid ``t`` ``[T]``, taken as they are (no
        noise, no normalisation): the first ``n_observed`` points observed, the rest predicted,
        initial conditions ``x[:, 0]`` (synthetic splits: probes, benchmarks, tests)."""
        obs, query = slice(None, n_observed), slice(n_observed, None)
        n = x.shape[0]
        return cls(t[obs], x[:, obs], t[query], x[:, query], x[:, query], np.arange(n), x[:, 0])


@dataclass(frozen=True, eq=False)
class Prepared:
    """A data set ready for training: splits, normaliser and provenance.

    Attributes:
        train, val, test: the splits. normaliser: fitted on ``train`` (or on every trajectory,
            see ``normalise_on``).
        n_observed: observed points per trajectory. seed, fractions, n_train: the split parameters.
        dataset_fingerprint: ``Dataset.fingerprint``.
        normalise_on: where the normalisation statistics came from (``"train"`` or ``"all"``).
        fingerprint: hash of the dataset fingerprint and the split parameters.
    """

    train: SplitData
    val: SplitData
    test: SplitData
    normaliser: Normaliser
    system: str
    n_observed: int
    seed: int
    fractions: tuple[float, float, float]
    n_train: int | None
    dataset_fingerprint: str
    fingerprint: str
    normalise_on: str = "train"


def _fractions(fractions) -> tuple[float, float, float]:
    try:
        fr = tuple(float(f) for f in fractions)
    except (TypeError, ValueError):
        raise ValueError(
            f"fractions must be three numbers (train, val, test), got {fractions!r}"
        ) from None
    if len(fr) != 3 or not all(math.isfinite(f) and f >= 0 for f in fr) or fr[0] <= 0:
        raise ValueError(
            "fractions must be three finite numbers >= 0 (train > 0) summing to 1, "
            f"got {fractions!r}"
        )
    if abs(sum(fr) - 1.0) > 1e-9:
        raise ValueError(f"fractions must sum to 1, got {fractions!r} (sum {sum(fr)})")
    return fr


def split_sizes(n: int, fr: tuple[float, float, float]) -> tuple[int, int, int]:
    """Trajectories in the train, validation and test splits of ``n`` at fractions ``fr``:
    rounded half up, at least one in a split of positive fraction."""
    n_val, n_test = (max(1 if f > 0 else 0, math.floor(f * n + 0.5)) for f in fr[1:])
    n_tr = n - n_val - n_test
    if n_tr < 1:
        raise ValueError(
            f"{n} trajectories are too few for fractions {fr}: the training split would be empty"
        )
    return n_tr, n_val, n_test


def check_split(
    n_trajectories: int,
    n_points: int,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    n_observed: int | None = None,
    n_train: int | None = None,
) -> tuple[int, int, int]:
    """The train (after the ``n_train`` sub-sample), validation and test sizes that
    :func:`prepare` would split ``n_trajectories`` of ``n_points`` points into, checked as it
    checks them, without the data: a config is refused before anything is simulated.

    Raises:
        ValueError: bad fractions, ``n_observed`` or ``n_train``, named as :func:`prepare`
            names them.
    """
    _observed(n_observed, n_points)
    n_tr, n_val, n_test = split_sizes(n_trajectories, _fractions(fractions))
    return (n_tr if n_train is None else _sub_sample(n_train, n_tr)), n_val, n_test


def _observed(n_observed: int | None, n_points: int) -> int:
    """The observed window's length: ``n_observed``, checked, or the first half."""
    half = n_points // 2
    if n_observed is None:
        return half
    if (
        isinstance(n_observed, bool)
        or not isinstance(n_observed, numbers.Integral)
        or not (1 <= n_observed <= half)
    ):
        raise ValueError(
            f"n_observed must be an integer in [1, {half}] (T = {n_points}), got {n_observed!r}"
        )
    return int(n_observed)


def _sub_sample(n_train: int, available: int) -> int:
    """``n_train``, checked against the ``available`` training trajectories."""
    if (
        isinstance(n_train, bool)
        or not isinstance(n_train, numbers.Integral)
        or not (1 <= n_train <= available)
    ):
        raise ValueError(f"n_train must be an integer in [1, {available}], got {n_train!r}")
    return int(n_train)


def prepare(
    ds: Dataset,
    *,
    seed: int = 0,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    n_observed: int | None = None,
    n_train: int | None = None,
    normalise_on: str = "train",
) -> Prepared:
    """Split ``ds`` into normalised train/val/test sets with observed and predicted windows.

    Args:
        ds: the data set.
        seed: seed of the trajectory permutation (and of the ``n_train`` sub-sample).
        fractions: (train, val, test) shares of the N trajectories, summing to 1.
        n_observed: observed points, 1..T//2 (default T//2): the ``n_observed`` points right before
            the prediction window, which is always the last T - T//2 points.
        n_train: keep this many training trajectories (1..size of the training split); validation
            and test are unchanged.  Sub-samples are nested: a smaller ``n_train`` keeps a subset of
            a larger one for the same seed.
        normalise_on: where the per-dimension z-score statistics come from. ``"train"``: the
            training split's observations (no test information reaches the model). ``"all"``:
            every trajectory before the split, with the unbiased standard deviation (ddof = 1),
            as the paper's reference code does (``generate_data_set`` in its
            ``experiments/datasets.py``).

    A data set simulated with ``noise_on="normalised"`` (noise-free values, ``ds.noise_std`` = σ)
    is z-scored with the statistics of those noise-free values and then gets σ times the data
    set's noise draws (:func:`datasets._simulate.noise_draws`, one per value of the whole data
    set, drawn before the split) in normalised units, on observations and targets of every
    split, as the reference code adds ``randn · noise_std`` to every trajectory after
    normalising; ``target_clean`` stays noise-free.

    Raises:
        ValueError: bad seed, fractions, ``n_observed``, ``n_train`` or ``normalise_on``.
    """
    if normalise_on not in NORMALISE_ON:
        raise ValueError(
            f"normalise_on must be one of {', '.join(map(repr, NORMALISE_ON))}, "
            f"got {normalise_on!r}"
        )
    seed = check_int("seed", seed, 0)
    fr = _fractions(fractions)
    n_all, n_pts = ds.n_trajectories, ds.n_points
    half, n_observed = n_pts // 2, _observed(n_observed, n_pts)
    sizes = split_sizes(n_all, fr)

    split_seq, sub_seq = np.random.SeedSequence(seed).spawn(2)
    perm = np.random.default_rng(split_seq).permutation(n_all)
    tr, va, te = np.split(perm, np.cumsum(sizes)[:2])
    if n_train is not None:
        n_train = _sub_sample(n_train, tr.size)
        tr = tr[np.random.default_rng(sub_seq).permutation(tr.size)[:n_train]]
    tr, va, te = np.sort(tr), np.sort(va), np.sort(te)

    # Statistics of the observations (all T points; noisy where the noise is raw, noise-free
    # where it comes after) of the training split, or of all trajectories with the unbiased std
    # as the reference code's torch ``std(0)`` computes it.
    if normalise_on == "train":
        stat_x, ddof = ds.x[tr].reshape(-1, ds.state_dim), 0
    else:
        stat_x, ddof = ds.x.reshape(-1, ds.state_dim), 1
    std = stat_x.std(axis=0, ddof=ddof)
    norm = Normaliser(mean=stat_x.mean(axis=0), std=np.where(std > _MIN_STD, std, 1.0))

    obs = slice(half - n_observed, half)
    query = slice(half, n_pts)
    # Raw noise is in ds.x already (None: nothing added, the arrays' bytes as before).
    noise = (
        ds.noise_std * noise_draws(ds.seed, ds.x.shape)
        if ds.noise_on == "normalised" and ds.noise_std > 0.0
        else None
    )

    def values(idx: np.ndarray, window: slice) -> np.ndarray:
        z = norm.transform(ds.x[idx, window])
        return read_only(z if noise is None else z + noise[idx, window])

    def split(idx: np.ndarray) -> SplitData:
        idx.flags.writeable = False
        return SplitData(
            obs_t=read_only(ds.t[obs]),
            obs_x=values(idx, obs),
            query_t=read_only(ds.t[query]),
            target=values(idx, query),
            target_clean=read_only(norm.transform(ds.x_clean[idx, query])),
            index=idx,
            ic=read_only(ds.ic[idx]),
        )

    params = {
        "dataset": ds.fingerprint,
        "seed": seed,
        "fractions": [f.hex() for f in fr],
        "n_observed": n_observed,
        "n_train": n_train,
    }
    if normalise_on != "train":  # fingerprints of train-normalised splits stay as they were
        params["normalise_on"] = normalise_on
    fingerprint = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
    return Prepared(
        train=split(tr),
        val=split(va),
        test=split(te),
        normaliser=norm,
        system=ds.system,
        n_observed=n_observed,
        seed=seed,
        fractions=fr,
        n_train=n_train,
        dataset_fingerprint=ds.fingerprint,
        fingerprint=fingerprint,
        normalise_on=normalise_on,
    )
