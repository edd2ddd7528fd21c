"""This machine and what it computes: the numerics a cell's result depends on and how reuse
decides, where a pack trains and with how many workers, and the checks of ``nllab doctor``.

How reuse decides, in one place: a stored cell is reused (:func:`stored_results`,
:mod:`.reuse`) when its config hash matches and its numerics fingerprints equal today's
(:func:`cell_fingerprints`, :mod:`.numerics`); the fingerprints themselves (a model's and a
system's canary bytes, the pinned bytes of the portable CPU kernels) are the training floor's
(:func:`nltrain.numerics.model_fingerprint`, :func:`nltrain.numerics.check_pinned`), set up by
:func:`nlmodels.set_up_numerics`.

- :mod:`.numerics`, :mod:`.reuse`: the numerics of a cell and the one answer "is it done?";
- :mod:`.placement`, :mod:`.balance`: the device of each pack, measured, and the plan that
  finishes first;
- :mod:`.workers`, :mod:`.model_memory`, :mod:`.priority`, :mod:`.filelock`: worker
  processes and cores, a model's memory, low CPU priority, one file lock;
- :mod:`.doctor`: what ``nllab doctor`` checks.

Names load on first use (PEP 562): importing the room loads none of its modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from tasks.machine.balance import balance_devices, busy_seconds
    from tasks.machine.doctor import Finding, diagnose, problem_lines
    from tasks.machine.filelock import exclusive
    from tasks.machine.model_memory import check_models_build, check_models_fit
    from tasks.machine.numerics import CellNumerics, cell_fingerprints, device_identity
    from tasks.machine.placement import Probe, gpu_pack_size, place_pack, probe_pack
    from tasks.machine.priority import lower_priority
    from tasks.machine.reuse import stored_result, stored_results
    from tasks.machine.workers import WorkerDied, run_in_worker, usable_cores, worker_threads

_LAZY = {
    "CellNumerics": "numerics",
    "cell_fingerprints": "numerics",
    "device_identity": "numerics",
    "stored_result": "reuse",
    "stored_results": "reuse",
    "place_pack": "placement",
    "probe_pack": "placement",
    "gpu_pack_size": "placement",
    "Probe": "placement",
    "balance_devices": "balance",
    "busy_seconds": "balance",
    "usable_cores": "workers",
    "run_in_worker": "workers",
    "worker_threads": "workers",
    "WorkerDied": "workers",
    "check_models_fit": "model_memory",
    "check_models_build": "model_memory",
    "lower_priority": "priority",
    "exclusive": "filelock",
    "diagnose": "doctor",
    "Finding": "doctor",
    "problem_lines": "doctor",
}

__all__ = [
    "CellNumerics",
    "Finding",
    "Probe",
    "WorkerDied",
    "balance_devices",
    "busy_seconds",
    "cell_fingerprints",
    "check_models_build",
    "check_models_fit",
    "device_identity",
    "diagnose",
    "exclusive",
    "gpu_pack_size",
    "lower_priority",
    "place_pack",
    "probe_pack",
    "problem_lines",
    "run_in_worker",
    "stored_result",
    "stored_results",
    "usable_cores",
    "worker_threads",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
