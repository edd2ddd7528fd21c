"""Reuse by numerics: which stored cells today's code would compute differently.

The fingerprints themselves (a model's and a system's canary bytes, cached per source state)
are the training floor's (:func:`nltrain.numerics.model_fingerprint`,
:func:`nltrain.numerics.system_fingerprint`); here they are read for a run's cells, written as its
tags and compared with a stored run's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nltrain.numerics import (
    FINGERPRINT_FORMAT,
    canary_split,
    canary_training,
    model_fingerprint,
    model_settings,
    settings_text,
    system_fingerprint,
    training_digest,
)

if TYPE_CHECKING:
    from tasks.tracking import RunRecord

__all__ = [
    "CPU",
    "CellNumerics",
    "accepted_devices",
    "agrees",
    "cell_fingerprints",
    "cell_tags",
    "computation_identity",
    "data_settings",
    "device_identity",
    "earlier_fingerprints",
    "model_fingerprint",
    "model_key",
    "stale",
    "system_fingerprint",
    "system_key",
    "training_digest",
    "warm",
]


def model_key(cell) -> tuple[str, str, int, str]:
    """The model canary that fingerprints ``cell``'s model: the method, its settings
    (canonical JSON), the state dimension of the cell's system it is built for and how its
    protocol changes the canary's (:func:`nltrain.numerics.canary_training`, canonical JSON)."""
    from tasks.config.declarations import system_info  # (declares a data file's system here)

    settings = settings_text(model_settings(cell.method, cell.model))
    dim = int(system_info(cell.system, cell.data).state_dim)
    return cell.method, settings, dim, settings_text(canary_training(cell.training))


def data_settings(cell) -> dict[str, object]:
    """The keywords ``cell`` makes its data set with (its data configuration's fields but the
    system's source, which its name stands for, and where the noise goes where that changes
    nothing: raw noise, as before the setting, or no noise)."""
    exclude = {"source"} if cell.data.noise_effective else {"source", "noise_on"}
    return cell.data.model_dump(exclude=exclude)


def system_key(cell) -> tuple[str, str]:
    """The system canary that fingerprints ``cell``'s data set: the system and the keywords
    its data are made with, as the canary takes them (:func:`nltrain.numerics.canary_split`,
    canonical JSON)."""
    return cell.system, settings_text(canary_split(data_settings(cell)))


def _model_of(key: tuple[str, str, int, str], cell) -> str:
    return model_fingerprint(cell.method, cell.model, key[2], cell.training)


def _system_of(cell) -> str:
    return system_fingerprint(cell.system, data_settings(cell))


def cell_fingerprints(cell) -> tuple[str, str]:
    """Today's fingerprints of ``cell``'s model (as its settings build it for its system's
    state dimension and its protocol trains it) and of its data set (made and split as the
    cell's are)."""
    return _model_of(model_key(cell), cell), _system_of(cell)


#: A run's :func:`device_identity` on the CPU (its numerics are the fingerprints' own).
CPU = "cpu"


def device_identity(device: str) -> str:
    """Where a cell computed, as its numerics identity names it: ``cpu`` (the CPU numerics the
    fingerprints check), or ``cuda: <GPU>; torch <version>; CUDA <version>`` for a CUDA device:
    cuBLAS and cuDNN pick kernels by GPU and library version, and round otherwise than the CPU
    kernels, so a result computed there is another computation's."""
    if not str(device).startswith("cuda"):
        return CPU
    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else "?"
    return f"cuda: {name}; torch {torch.__version__}; CUDA {torch.version.cuda}"


def computation_identity(cell, device) -> str:
    """What must be equal for a stored training state of ``cell`` to be resumed on ``device``
    (:class:`nltrain.Checkpoints`): its config hash, today's numerics fingerprints and the
    device's numerics, so that a checkpoint resumes only the computation that wrote it."""
    return " ".join((cell.config_hash(), *cell_fingerprints(cell), device_identity(str(device))))


def accepted_devices(device: str) -> frozenset[str]:
    """The device identities whose runs a cell asked to train on ``device`` (``cpu``, ``cuda``,
    ``auto``) may reuse: those of the devices it may train on here. A GPU's run is never a CPU
    cell's result, nor the other way round."""
    if device == "cpu":
        return frozenset({CPU})
    import torch

    gpu = {device_identity("cuda")} if torch.cuda.is_available() else set()
    return frozenset(gpu if device.startswith("cuda") else {CPU, *gpu})


@dataclass(frozen=True)
class CellNumerics:
    """Today's fingerprints of the models and data sets of some cells (keyed as
    :func:`cell_fingerprints` tells them apart), and the devices whose runs count
    (:func:`accepted_devices`)."""

    models: Mapping[tuple[str, str, int, str], str]
    systems: Mapping[tuple[str, str], str]
    devices: frozenset[str] = frozenset({CPU})

    def model(self, cell) -> str:
        """Today's fingerprint of ``cell``'s model."""
        return self.models[model_key(cell)]

    def system(self, cell) -> str:
        """Today's fingerprint of ``cell``'s data set, split as the cell splits it."""
        return self.systems[system_key(cell)]


def warm(cells: Iterable, device: str = CPU) -> CellNumerics:
    """Today's fingerprints of the models and data sets of ``cells`` (computed now if not
    cached, so worker processes then only read them), for cells asked to train on ``device``."""
    cells = list(cells)
    models = {model_key(c): c for c in cells}
    systems = {system_key(c): c for c in cells}
    return CellNumerics(
        {key: _model_of(key, c) for key, c in sorted(models.items())},
        {key: _system_of(c) for key, c in sorted(systems.items())},
        accepted_devices(device),
    )


def earlier_fingerprints(cell, fmt: str) -> tuple[str, str] | None:
    """What the canaries of an earlier ``fmt`` (a run's ``numerics.format``) compute for
    ``cell`` with today's code, where today's module still runs them (None where it does not).
    Format 2.1's are today's canaries with the canary's own protocol and, of the cell's data
    keywords, its normalisation and sub-sample alone: a run they fingerprinted whose
    fingerprints they still compute is what they would reuse today."""
    if fmt != "2.1":
        return None
    kept = {k: v for k, v in data_settings(cell).items() if k in ("normalise_on", "n_train")}
    dim = model_key(cell)[2]
    return model_fingerprint(cell.method, cell.model, dim), system_fingerprint(cell.system, kept)


def agrees(cell, tags: Mapping[str, str], today: CellNumerics) -> bool:
    """Whether the run of ``cell`` tagged ``tags`` was computed by today's numerics: on a device
    ``today`` accepts (:func:`accepted_devices`), with today's fingerprints or those the earlier
    canaries that made them compute still (:func:`earlier_fingerprints`)."""
    from tasks.tracking.tags import RunTags

    stored = tags.get(RunTags.NUMERICS_MODEL), tags.get(RunTags.NUMERICS_SYSTEM)
    if None in stored or tags.get(RunTags.NUMERICS_DEVICE, CPU) not in today.devices:
        return False
    if stored == (today.model(cell), today.system(cell)):
        return True
    fmt = tags.get(RunTags.NUMERICS_FORMAT, "1")
    return fmt != FINGERPRINT_FORMAT and earlier_fingerprints(cell, fmt) == stored


def cell_tags(cell) -> dict[str, str]:
    """The ``numerics.model``, ``numerics.system`` and ``numerics.format`` tags of a cell's
    run."""
    from tasks.tracking.tags import RunTags

    model, system = cell_fingerprints(cell)
    return {
        RunTags.NUMERICS_MODEL: model,
        RunTags.NUMERICS_SYSTEM: system,
        RunTags.NUMERICS_FORMAT: FINGERPRINT_FORMAT,
    }


#: Why stored cells were retrained where no model or system is to blame (after their count).
_UNRECORDED = (
    "stored without numerics fingerprints (before they were recorded) retrained; "
    "--reuse config reuses them"
)
_OTHER_CANARIES = (
    f"fingerprinted by earlier numerics canaries (before format {FINGERPRINT_FORMAT}, which "
    "train and make data as the cell does) retrained; --reuse config reuses them"
)


def stale(
    cells: Iterable, records: Mapping[str, RunRecord], today: CellNumerics
) -> tuple[set[str], list[str]]:
    """Which stored runs (``records``: config hash → :class:`tasks.tracking.RunRecord`) were
    computed by other numerics than today's: their config hashes, and one line per changed
    model or system (and one per other CPU numerics mode the runs were trained in, one for runs
    stored before fingerprints were recorded, one for runs fingerprinted by other canaries:
    none of these says which model changed)."""
    from nlmodels import cpu_mode_in_effect
    from tasks.tracking.tags import RunTags

    out: set[str] = set()
    changed: dict[tuple[str, str], list[str]] = {}
    others: dict[str, int] = {}  # why (no model or system to blame) -> cells
    for c in cells:
        h = c.config_hash()
        record = records.get(h)
        if record is None or h in out:
            continue
        tags = record.tags
        model, system = tags.get(RunTags.NUMERICS_MODEL), tags.get(RunTags.NUMERICS_SYSTEM)
        if model is not None and system is not None and agrees(c, tags, today):
            continue
        out.add(h)
        mode = tags.get(RunTags.CPU_NUMERICS) or cpu_mode_in_effect()
        if model is None or system is None:
            why = _UNRECORDED
        elif (where := tags.get(RunTags.NUMERICS_DEVICE, CPU)) not in today.devices:
            why = f"trained on another device ({where}) retrained here: its numerics are its own"
        elif tags.get(RunTags.NUMERICS_FORMAT, "1") != FINGERPRINT_FORMAT:
            why = _OTHER_CANARIES
        elif mode != cpu_mode_in_effect():  # the CPU numerics changed, not the code
            why = (
                f"trained in other CPU numerics ({mode}; now {cpu_mode_in_effect()}) "
                "retrained: the numerics changed, not the code"
            )
        else:
            commit = (tags.get(RunTags.GIT_COMMIT) or "")[:7] or "unknown"
            if model != today.model(c):
                changed.setdefault((c.method, "model"), []).append(commit)
            if system != today.system(c):
                changed.setdefault((c.system, "data set"), []).append(commit)
            continue
        others[why] = others.get(why, 0) + 1
    lines = [
        f"{'' if kind == 'model' else 'the data set '}{name} changed since commit "
        f"{max(set(commits), key=commits.count)}: {len(commits)} "
        f"cell{'s' if len(commits) != 1 else ''} retrained"
        for (name, kind), commits in sorted(changed.items())
    ]
    lines += [f"{n} finished cell{'s' if n != 1 else ''} {why}" for why, n in others.items()]
    return out, lines
