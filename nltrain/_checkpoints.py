"""Checkpoints of a training loop between epochs, so that a run stopped by the end of a session,
Ctrl-C or a lost machine resumes where it stood and finishes with the bytes it would have had
uninterrupted.

A checkpoint holds everything the rest of a run reads: the step function's state (the weights,
Adam's moments and step counts, the shuffling streams, every ``torch.Generator`` a model keeps
for its own draws: :func:`generator_states`), and the loop's (each cell's epochs so far, its
best score and weights, the seconds spent). :func:`nltrain.train_loop` writes one at the end of
an epoch every ``every_seconds`` (the cells that stopped with their results), and one when they
have all finished (their results and best weights: a caller that dies before recording them
loses no training). It is read back before the first epoch, only by a loop over the same cells
under the same identities (the caller's: a cell's config hash and numerics fingerprints, so that
a checkpoint is never resumed by other numerics), and removed by :meth:`Checkpoints.discard`
once the caller has kept the results.

Files: ``<name>.pt`` (:func:`torch.save`, read back with ``weights_only=True``: tensors, numbers
and strings only) and its ``<name>.json`` (the labels and identities, read without torch), each
written atomically (a temporary file renamed over the old one).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nltrain._files import write_atomically

if TYPE_CHECKING:  # torch loads when a checkpoint is read or written: listing them needs none
    import torch
    from torch import nn

__all__ = [
    "Checkpoints",
    "Progress",
    "generator_states",
    "restore_generators",
]

#: Bumped when the layout of a checkpoint changes: an older file is then not resumed.
FORMAT = 1


class Progress(NamedTuple):
    """Where a kept run stands: its cells' labels, the last epoch saved (None: finished), and
    the identities it resumes under (one per label)."""

    labels: tuple[str, ...]
    epoch: int | None
    identities: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoints:
    """Where a training loop keeps its checkpoints and under which identities.

    ``identities``: per label of the loop's cells, what must be equal for a checkpoint to be
    resumed (a loop with a label missing here keeps none); ``every_seconds``: the least time
    between two checkpoints of a run (0: every epoch)."""

    folder: Path
    identities: Mapping[str, str] = field(default_factory=dict)
    every_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not self.every_seconds >= 0:
            raise ValueError(f"every_seconds must be >= 0, got {self.every_seconds}")

    def covers(self, labels: Sequence[str]) -> bool:
        """Whether a loop over ``labels`` keeps checkpoints here."""
        return bool(labels) and all(label in self.identities for label in labels)

    def _meta(self, labels: Sequence[str]) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "labels": list(labels),
            "identities": [self.identities[label] for label in labels],
        }

    def _stem(self, labels: Sequence[str]) -> Path:
        text = json.dumps(self._meta(labels), sort_keys=True)
        return self.folder / hashlib.sha256(text.encode()).hexdigest()[:24]

    def load(self, labels: Sequence[str]) -> dict[str, Any] | None:
        """The checkpoint of a loop over ``labels``, or None (none; or one that cannot be read,
        with a warning naming the file: the run then starts from its first epoch)."""
        if not self.covers(labels):
            return None
        stem = self._stem(labels)
        pt, meta = stem.with_suffix(".pt"), stem.with_suffix(".json")
        if not pt.exists():
            return None
        try:
            info = json.loads(meta.read_text())
            if {k: info.get(k) for k in ("format", "labels", "identities")} != self._meta(labels):
                raise ValueError("it was written for other cells or numerics")
            import torch

            state = torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:  # a torn or foreign file must not stop training
            warnings.warn(
                f"checkpoint {pt} not resumed ({type(e).__name__}: {e}); training from the start",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        return state

    def save(self, labels: Sequence[str], state: Mapping[str, Any]) -> Path:
        """Write the checkpoint of a loop over ``labels`` (atomically: a reader sees the old
        file or the new one, never a part)."""
        import torch

        stem = self._stem(labels)
        self.folder.mkdir(parents=True, exist_ok=True)
        pt = stem.with_suffix(".pt")
        write_atomically(pt, lambda f: torch.save(dict(state), f))
        info = self._meta(labels) | {"epoch": state.get("epoch"), "finished": state["finished"]}
        write_atomically(stem.with_suffix(".json"), lambda f: f.write(json.dumps(info).encode()))
        return pt

    def _sidecars(self) -> list[tuple[Path, dict[str, Any]]]:
        """Each ``.json`` file here with what it says (files that cannot be read left out)."""
        found = []
        for meta in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            try:
                info = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(info, dict):
                found.append((meta, info))
        return found

    def progress(self) -> list[Progress]:
        """The runs kept here, from their ``.json`` files (no torch), in the order of their
        labels; files that cannot be read are left out."""
        found = []
        for meta, info in self._sidecars():
            try:
                labels, finished = tuple(map(str, info["labels"])), bool(info["finished"])
                epoch = None if finished else int(info["epoch"])
                identities = tuple(map(str, info.get("identities") or ()))
            except (ValueError, KeyError, TypeError):
                continue
            if meta.with_suffix(".pt").exists():
                found.append(Progress(labels, epoch, identities))
        return sorted(found, key=lambda p: p.labels)

    def discard(self, labels: Sequence[str]) -> int:
        """Remove every checkpoint here of a loop over any of ``labels`` under today's
        identities (the caller has kept those cells' results); how many were removed."""
        wanted = {(label, self.identities.get(label)) for label in labels}
        removed = 0
        for meta, info in self._sidecars():
            try:
                pairs = set(zip(info["labels"], info["identities"], strict=True))
            except (ValueError, KeyError, TypeError):
                continue
            if pairs & wanted:
                meta.with_suffix(".pt").unlink(missing_ok=True)
                meta.unlink(missing_ok=True)
                removed += 1
        return removed


def _generators(model: nn.Module) -> dict[str, torch.Generator]:
    """Every attribute of ``model``'s modules that holds a ``torch.Generator``, by dotted path."""
    import torch

    return {
        f"{path}.{name}" if path else name: value
        for path, module in model.named_modules()
        for name, value in vars(module).items()
        if isinstance(value, torch.Generator)
    }


def generator_states(model: nn.Module) -> dict[str, Any]:
    """The state of every ``torch.Generator`` ``model``'s modules hold (their own sampling
    streams), by attribute path: ``[device, state]``. Found by looking, not from a list: any
    model's streams are saved (a stream a model starts lazily is absent until it starts)."""
    return {path: [str(gen.device), gen.get_state()] for path, gen in _generators(model).items()}


def restore_generators(model: nn.Module, states: Mapping[str, Any]) -> None:
    """Put back :func:`generator_states` into a model built as the saved one was: each saved
    stream as it was (a fresh generator on its device, its state set), and a stream this model
    holds but the saved one had not started yet (absent there) unset again (None)."""
    import torch

    for path in _generators(model).keys() - states.keys():
        module_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(module_path), name, None)
    for path, (device, state) in states.items():
        module_path, _, name = path.rpartition(".")
        module = model.get_submodule(module_path)
        if name not in vars(module):
            raise ValueError(f"the checkpoint has a generator {path!r} this model does not keep")
        gen = torch.Generator(device)
        gen.set_state(state)
        setattr(module, name, gen)
