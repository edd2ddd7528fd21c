"""Where and under which numerics a ledger record was made: the processor's (or GPU's) name and
the record's ``numerics`` (its model's and data set's numerics fingerprints,
:mod:`tasks.machine.numerics`). Only the standard library loads here; torch where a GPU is named."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import CellConfig

__all__ = ["cell_numerics", "computed_on_gpu", "cpuinfo_line", "hardware_name", "numerics_of"]


def hardware_name(device: str) -> str:
    """The model of the processor that trained on ``device`` (``cuda…``: the GPU's name)."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.device(device))
    line = cpuinfo_line("model name")
    if line is not None:
        return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpuinfo_line(*prefixes: str) -> str | None:
    """The first line of ``/proc/cpuinfo`` that starts with one of ``prefixes`` (None if none,
    or where the file is absent)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(prefixes):
                return line
    except OSError:
        pass
    return None


def numerics_of(model: str | None, system: str | None, device: str | None = None) -> str | None:
    """A record's ``numerics``: the fingerprints of its model and its data set
    (``model/system``, :mod:`tasks.machine.numerics`), and where it computed unless on the CPU
    (``@`` and its :func:`tasks.machine.numerics.device_identity`: a GPU's result is its own);
    ``None`` where the run carried no fingerprints."""
    if not (model and system):
        return None
    return f"{model}/{system}" + (f"@{device}" if device and device != "cpu" else "")


def computed_on_gpu(numerics: str | None) -> bool:
    """Whether a record's ``numerics`` (:func:`numerics_of`) names a GPU."""
    return numerics is not None and "@cuda" in numerics


def cell_numerics(cell: CellConfig) -> str:
    """Today's ``numerics`` of ``cell`` (its fingerprints computed, or read from their cache)."""
    from tasks.machine import cell_fingerprints

    return numerics_of(*cell_fingerprints(cell)) or ""
