"""The bytes the portable CPU numerics mode promises on every x86-64 CPU with AVX2 and FMA, and
how this machine compares (``nllab doctor``; the tests hold the same pins).

* ``data``: ``sha256(simulate(system, n_trajectories=200, seed=0).x)[:16]``, the quick
  profile's data of each main system (either mode: the data sets never call BLAS).
* ``training``: :func:`nltrain.numerics.training_digest` of each built-in model at its defaults and,
  under the labels of :data:`PINNED_SETTINGS`, with the settings the paper profile and its
  ablation build it with, for each state dimension of their systems (portable mode; Neural
  Laplace with its native kernels, ``training_twins`` with their torch twins,
  NLLAB_NATIVE=0).

Pinned with torch 2.13.0 (CPU build), numpy 2.4, glibc 2.36 (its vector maths library computes
the portable elementary functions); other builds of those may compute other bytes, which the
check then names. Revisions: stiff Van der Pol's data when its solver became RODAS4 in
element-wise arithmetic (LSODA's bytes followed the kernels OpenBLAS picks per CPU); every
training digest when products and elementary functions left MKL (the earlier pins held on AMD
CPUs only: MKL runs other code on Intel ones); every training digest when the canary grew to
the sizes that reach every branch of the native kernels (45 training trajectories in batches
of 37); the Laplace Neural Operator's when its Fourier transform left the FFT (MKL's, which
picks its code by CPU vendor) for products with the DFT matrix. Added, not revised: the
reference protocol's NODE, ANODE (first-query start, adjoint) and Latent ODE (sampled
prediction, ELBO selection), pinned with the same builds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = [
    "PINNED",
    "PINNED_SETTINGS",
    "PINNED_WITH",
    "Mismatch",
    "PinnedCheck",
    "check_pinned",
    "data_digest",
    "last_pinned_check",
    "pinned_label",
    "pinned_mismatches",
    "pinned_model",
]

#: The reference protocol's Latent ODE (sampled prediction, ELBO selection), as pinned.
_SAMPLED_LATENT = (
    "latent_ode (kl_average=latents, predict=sample, select=val_loss, z0_time=first_query)"
)
PINNED_WITH = "torch 2.13.0, numpy 2.4, glibc 2.36"
PINNED = {
    "data": {
        "spiral_dde": "7661b9870a07b19d",
        "lotka_volterra_dde": "7acc7d7f93792003",
        "mackey_glass_dde": "b5b852ee3dd35871",
        "stiff_van_der_pol": "32ca1885be77a778",
        "piecewise_forcing_ode": "ad8e494091640ee7",
        "integro_de": "c8494c357eb58022",
    },
    "training": {
        "anode": "bec0b636e0b34c98",
        "latent_ode": "44e27c22e66c185e",
        "neural_laplace": "9e7f559dbc111728",
        "nf_coupling": "33c6431747d66383",
        "nf_resnet": "b7a930ed366f8d55",
        "node": "aa4bec3d721d9bac",
        "node (adjoint=True, start=first_query)": "d01f4f284d700e35",
        "node (adjoint=True, start=first_query) 1-D": "2114cf384a91d8a0",
        "anode (adjoint=True, start=first_query)": "a483d14be5e1beee",
        "anode (adjoint=True, start=first_query) 1-D": "834db8b38333e7b7",
        _SAMPLED_LATENT: "766005e16a75a463",
        f"{_SAMPLED_LATENT} 1-D": "2c6e76025faad686",
        "latent_ode (kl_average=latents, z0_time=first_query)": "2328963e99c3d1e2",
        "neural_laplace (stereographic=False)": "60aa0c1aeb919149",
        "nf_coupling (time_net=linear)": "3ab88c6c9a266b32",
        "nf_resnet (time_net=linear)": "d31841a50b237a2d",
        "anode 1-D": "5719be1194d78400",
        "latent_ode (kl_average=latents, z0_time=first_query) 1-D": "e45ef599f458910a",
        "neural_laplace 1-D": "debe904090d0d50f",
        "neural_laplace (stereographic=False) 1-D": "f61d3a0d89e1816e",
        "nf_coupling (time_net=linear) 1-D": "139cb8eb163c9d7a",
        "nf_resnet (time_net=linear) 1-D": "ed2e9a0cdc834f93",
        "node 1-D": "9ad706faa5cfc52c",
        "laplace_net": "822777c8c9bb2202",
        "laplace_net 1-D": "3ad6a9e13df3c3d2",
        "lno": "fd216e0bb8d301b0",
        "lno 1-D": "1b04d25ef0d1d713",
        "neural_dde": "7978072a9f994e35",
        "neural_dde 1-D": "9d0792451b7b3e17",
    },
    "training_twins": {
        "neural_laplace": "ab578be2cbc16035",
        "neural_laplace (stereographic=False)": "79aca6c507af13c8",
        "neural_laplace 1-D": "e649e123ee8dde14",
        "neural_laplace (stereographic=False) 1-D": "3c823d0e5130e5f2",
    },
}


def pinned_label(method: str, settings: dict[str, object], state_dim: int = 2) -> str:
    """The label a model built with ``settings`` (non-default keywords) for ``state_dim``
    dimensions is pinned under (2-D, a model's canary before it ran each cell's dimension,
    unmarked)."""
    label = method
    if settings:
        label += f" ({', '.join(f'{k}={v}' for k, v in sorted(settings.items()))})"
    return label if state_dim == 2 else f"{label} {state_dim}-D"


#: The models pinned besides each built-in one at its defaults in 2-D (label in
#: ``PINNED["training"]`` -> method, settings, state dimension): those the paper profile and
#: the ledger's ablation build, for each of their systems' dimensions (the tests check that
#: each of theirs is).
_PINNED_BUILDS: tuple[tuple[str, dict[str, object]], ...] = (
    ("anode", {}),
    ("laplace_net", {}),
    ("lno", {}),
    ("neural_dde", {}),
    ("anode", {"adjoint": True, "start": "first_query"}),
    ("latent_ode", {"kl_average": "latents", "z0_time": "first_query"}),
    (
        "latent_ode",
        {
            "kl_average": "latents",
            "predict": "sample",
            "select": "val_loss",
            "z0_time": "first_query",
        },
    ),
    ("neural_laplace", {}),
    ("neural_laplace", {"stereographic": False}),
    ("nf_coupling", {"time_net": "linear"}),
    ("nf_resnet", {"time_net": "linear"}),
    ("node", {}),
    ("node", {"adjoint": True, "start": "first_query"}),
)
PINNED_SETTINGS: dict[str, tuple[str, dict[str, object], int]] = {
    pinned_label(method, settings, dim): (method, settings, dim)
    for method, settings in _PINNED_BUILDS
    for dim in (1, 2)
    if settings or dim != 2
}


def pinned_model(label: str) -> tuple[str, dict[str, object], int]:
    """The (method, settings, state dimension) pinned under ``label``."""
    return PINNED_SETTINGS.get(label, (label, {}, 2))


@dataclass(frozen=True)
class Mismatch:
    """A component whose bytes on this machine differ from the pinned ones."""

    kind: str  # "data" or "training"
    name: str  # the system or the model
    got: str
    pinned: str

    @property
    def component(self) -> str:
        return f"{self.kind} of {self.name}"


def data_digest(system: str) -> str:
    """The digest ``PINNED["data"]`` holds for ``system``, computed here."""
    from datasets import simulate

    x = simulate(system, n_trajectories=200, seed=0, workers=1).x
    return hashlib.sha256(x.tobytes()).hexdigest()[:16]


def pinned_mismatches() -> list[Mismatch]:
    """Every pinned component whose bytes differ on this machine, in this process's numerics
    (the training pins hold for the portable mode only: in another mode they are compared too,
    and a difference then names the mode)."""
    from nlmodels import native_cpu_kernels
    from nltrain.numerics._fingerprints import training_digest

    out = []
    for system, pinned in PINNED["data"].items():
        got = data_digest(system)
        if got != pinned:
            out.append(Mismatch("data", system, got, pinned))
    for label, pinned in PINNED["training"].items():
        method, settings, dim = pinned_model(label)
        if method == "neural_laplace" and not native_cpu_kernels():
            pinned = PINNED["training_twins"][label]
        got = training_digest(method, settings, dim)
        if got != pinned:
            out.append(Mismatch("training", label, got, pinned))
    return out


@dataclass(frozen=True)
class PinnedCheck:
    """This machine's bytes against :data:`PINNED`: the differing components (empty: as
    pinned), under a key naming the code, the numerics and the CPU that computed them."""

    key: str
    mismatches: tuple[Mismatch, ...]

    @property
    def verdict(self) -> str:
        """``as pinned``, or ``differs: training of node, data of ...`` (a run's tag)."""
        if not self.mismatches:
            return "as pinned"
        return "differs: " + ", ".join(m.component for m in self.mismatches)


def _check_key() -> str:
    """The code, the versions, the CPU, the C library and the environment
    (:func:`nltrain.numerics.source_key`, which covers :func:`nlmodels.numerics_environment`) and
    the numerics in effect."""
    from nlmodels import numerics_tag
    from nltrain.numerics._fingerprints import source_key

    h = hashlib.sha256(source_key().encode())
    h.update(numerics_tag().split("; torch_threads")[0].encode())
    return h.hexdigest()[:24]


def _check_record(key: str) -> str:
    return f"pinned-{key}.json"


def last_pinned_check() -> PinnedCheck | None:
    """The check this machine made for today's code, numerics and CPU (``nllab doctor``), read
    from the numerics cache (the installation's, else the home's:
    :mod:`nltrain.numerics._fingerprints`); None when none was made. Computes nothing."""
    from nltrain.numerics._fingerprints import read_record

    key = _check_key()
    record = read_record(_check_record(key))
    if record is None:  # none kept
        return None
    try:
        return PinnedCheck(key, tuple(Mismatch(**m) for m in record["mismatches"]))
    except (KeyError, TypeError):  # not a check's record
        return None


def check_pinned(*, fresh: bool = False) -> tuple[PinnedCheck, bool]:
    """This machine's :class:`PinnedCheck` and whether it was computed now (else read from the
    numerics cache, where a computed one is kept for :func:`last_pinned_check`); ``fresh``
    recomputes."""
    from nltrain.numerics._fingerprints import keep_record

    check = None if fresh else last_pinned_check()
    if check is not None:
        return check, False
    key = _check_key()
    check = PinnedCheck(key, tuple(pinned_mismatches()))
    record = {"mismatches": [m.__dict__ for m in check.mismatches], "pinned_with": PINNED_WITH}
    keep_record(_check_record(key), record)
    return check, True
