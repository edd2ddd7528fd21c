"""Where a cell trains: ``--device auto`` measures rather than assumes.

Small models can train slower on a GPU than on one CPU core (every step launches many tiny
kernels and waits on the host), so ``auto`` times a few training steps of the cell's model, at the
cell's shapes, on each available device and picks the faster one. The measurement is cached per
machine (host, CPU, GPU, torch version) in ``$NLLAB_HOME/placement.json``, so each kind of cell
is probed once per machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from tasks.config import CellConfig
from tasks.training import select_device

__all__ = ["PROBE_STEPS", "choose_fastest", "machine_fingerprint", "place_cell", "probe_seconds"]

#: Timed training steps per device (after one untimed warm-up step).
PROBE_STEPS = 3
_LOCK = threading.Lock()

Measure = Callable[[CellConfig, torch.device], float]


def machine_fingerprint() -> str:
    """What the measurement depends on: host, CPU, GPU and torch build."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    parts = (platform.node(), platform.processor(), str(os.cpu_count()), gpu, torch.__version__)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def choose_fastest(seconds: Mapping[str, float]) -> str:
    """The device with the smallest measured step time (ties: the first given)."""
    if not seconds:
        raise ValueError("no device was measured")
    return min(seconds, key=lambda d: seconds[d])


def probe_seconds(cell: CellConfig, device: torch.device) -> float:
    """Median seconds of one training step of ``cell``'s model at its batch shape on ``device``."""
    from datasets import SYSTEMS
    from nlmodels import build_model

    info = SYSTEMS[cell.system]
    n_points = cell.data.n_points or info.default_points
    n_obs = cell.data.n_observed or n_points // 2
    dtype = {"float64": torch.float64, "float32": torch.float32}[cell.training.dtype]
    b, d = cell.training.batch_size, info.state_dim
    gen = torch.Generator().manual_seed(0)
    t = torch.linspace(0.1, 1.0, n_points, dtype=dtype)
    obs_x = torch.randn(b, n_obs, d, generator=gen, dtype=dtype).to(device)
    target = torch.randn(b, n_points - n_obs, d, generator=gen, dtype=dtype).to(device)
    obs_t, query_t = t[:n_obs].to(device), t[n_obs:].to(device)
    model = build_model(cell.method, d, **cell.model).to(device=device, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=cell.training.lr)
    times = []
    for i in range(PROBE_STEPS + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model.training_loss(obs_t, obs_x, query_t, target).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _cache_path(cache_dir: Path | None) -> Path:
    from datasets import data_home

    return (Path(cache_dir) if cache_dir is not None else data_home()) / "placement.json"


def _probe_key(cell: CellConfig) -> str:
    # The measurement depends on the model and the shapes, not on the seed or the data values.
    payload = {
        "method": cell.method,
        "model": cell.model,
        "system": cell.system,
        "data": cell.data.model_dump(mode="json"),
        "batch_size": cell.training.batch_size,
        "dtype": cell.training.dtype,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def place_cell(
    cell: CellConfig,
    requested: str,
    *,
    cache_dir: Path | None = None,
    measure: Measure | None = None,
    cuda_available: bool | None = None,
) -> torch.device:
    """The device ``cell`` trains on: ``cpu``/``cuda`` as asked; ``auto`` the faster one as
    measured on this machine (CPU without CUDA). ``measure`` replaces :func:`probe_seconds`."""
    if requested != "auto":
        return select_device(requested)
    has_cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not has_cuda:
        return torch.device("cpu")
    path = _cache_path(cache_dir)
    key = f"{machine_fingerprint()}/{_probe_key(cell)}"
    with _LOCK:
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = {}
        if key not in cached:
            measure = measure or probe_seconds
            cached[key] = {d: measure(cell, torch.device(d)) for d in ("cpu", "cuda")}
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
                tmp.replace(path)
            except OSError:
                pass  # a read-only home only costs a probe next time
    return torch.device(choose_fastest(cached[key]))
