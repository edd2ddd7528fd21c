"""The results ledger: one JSON line per finished full-budget cell, kept in the repository.

A machine's MLflow store does not outlive the machine, and the paper profile's 180 cells (six
methods × six systems × five seeds, Table 3 of the paper) take far longer than one working
stretch on any one machine. The ledger is what accumulates instead: plain text, reviewed like
code, appended to by ``nllab ledger run`` as each cell finishes, on whatever hardware is at hand.

A record names its cell (``system``, ``method``, ``seed``, ``config_hash``, and its ``ablation`` for
the cells beside Table 3: :data:`tasks.ledger.scope.ABLATIONS`), the code it ran at (``commit``, and
``numerics``: the model's and the data set's numerics fingerprints, ``None`` on records that predate
them), its scores (``test_rmse``, ``best_val_rmse``, ``rmse_without_top``, ``top_share``), how it
trained (``epochs``, ``best_epoch``, ``train_seconds``, and ``train_cpu_seconds``: its process's CPU
time, which other work on the machine does not inflate), where (``device``: ``cpu``/``cuda``,
``hardware``: the processor's or GPU's name) and the MLflow ``run_id`` on the machine that made it.
A cell of one of the paper's other tables (a study, :func:`flows.studies.ledger_study_cells`) also
names its ``study`` and its ``ablation`` says how it differs from the profile's cell
(``data.noise_std=0.1``); what a study measures beyond the test RMSE (the CMI of Table:CMI) is in
``measures``, what its figure draws of it (a training-loss history) in ``curves``
(:mod:`tasks.ledger.measured`). Only the standard library loads here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tasks.config.names import METHODS, PAPER_METHODS
from tasks.ledger.measured import Curve, Measured, checked_curves, finite
from tasks.tracking.tags import Metrics

__all__ = [
    "ABLATIONS",
    "DEFAULT_LEDGER",
    "PEERS",
    "LedgerCell",
    "LedgerError",
    "LedgerRecord",
    "LedgerScope",
    "append_records",
    "read_ledger",
    "record_of_run",
]

#: The repository's ledger of the paper profile (``results/paper/ledger.jsonl``).
DEFAULT_LEDGER = Path(__file__).resolve().parents[2] / "results" / "paper" / "ledger.jsonl"


#: The ablations the ledger keeps beside Table 3 (the paper's Table 5, top block): the record's
#: ``ablation`` key -> the model overrides of its cells (their methods: the overrides' keys).
ABLATIONS: dict[str, dict[str, dict[str, Any]]] = {
    "stereographic=False": {"neural_laplace": {"stereographic": False}},
}

#: The Laplace-domain peers the ledger keeps after Table 3, the ablations and the studies: the
#: main table's models that are not the paper's Table 3's (``nlmodels/models.toml``), in its
#: row order.
PEERS: tuple[str, ...] = tuple(m for m in METHODS if m not in PAPER_METHODS)


#: A record's fields that an older line may lack.
_OPTIONAL = ("note", "ablation", "study", "measures", "curves", "train_cpu_seconds")


def cell_label(system: str, method: str, seed: int, ablation: str = "", study: str = "") -> str:
    """``system/method/seedN``, with the study and the ablation (or variant) in brackets."""
    return _bracketed(f"{system}/{method}/seed{seed}", study, ablation)


def row_label(method: str, ablation: str = "", study: str = "") -> str:
    """The method with the study and the ablation (or variant) in brackets:
    ``node (noise; data.noise_std=0.1)``."""
    return _bracketed(method, study, ablation)


def _bracketed(text: str, *extra: str) -> str:
    joined = "; ".join(x for x in extra if x)
    return f"{text} ({joined})" if joined else text


class LedgerError(ValueError):
    """A malformed, duplicate or unplaceable ledger line (the message names the file and line
    number)."""


@dataclass(frozen=True)
class LedgerRecord:
    """One finished cell, as the ledger keeps it (the field names are the file's keys).

    ``status``/``ok``/``top_share``/``rmse_without_top`` make a record usable wherever a
    :class:`tasks.results.CellResult` is aggregated (:func:`tasks.reports.reporting.results_table`).
    """

    system: str
    method: str
    seed: int
    config_hash: str
    commit: str | None
    numerics: str | None
    test_rmse: float
    best_val_rmse: float | None
    rmse_without_top: float | None
    top_share: float | None
    epochs: int | None
    best_epoch: int | None
    train_seconds: float | None
    device: str | None
    hardware: str | None
    run_id: str | None
    note: str = ""
    #: "" for a cell of Table 3, else its ablation (:data:`tasks.ledger.scope.ABLATIONS`) or,
    #: in a study, its variant (:attr:`LedgerCell.ablation`)
    ablation: str = ""
    #: "" for Table 3, its ablation and the peers, else the study (another table of the paper)
    study: str = ""
    #: what the study measured of the trained model besides its test RMSE (name -> value)
    measures: Mapping[str, float] = field(default_factory=dict)
    #: what the study's figure draws of it (name -> a short series: :mod:`tasks.ledger.measured`
    #: says why a field of its own)
    curves: Mapping[str, Curve] = field(default_factory=dict)
    #: the training's CPU seconds in its process (:attr:`nltrain.TrainResult.cpu_seconds`: with
    #: one torch thread, ``train_seconds`` less what other work on the machine took from it);
    #: None on records made before it was kept, and where a checkpoint resumed from lacked it
    train_cpu_seconds: float | None = None

    status = "finished"
    ok = True
    diverged = None  # (a diverged run is recorded as it scored; its note says so)

    @property
    def key(self) -> tuple[str, str, str, str, int, str, str | None]:
        """What makes two records the same result: the cell (and the table that asked for
        it), its config and its numerics."""
        return (
            self.system,
            self.method,
            self.study,
            self.ablation,
            self.seed,
            self.config_hash,
            self.numerics,
        )

    @property
    def cell_key(self) -> str:
        return cell_label(self.system, self.method, self.seed, self.ablation, self.study)

    @property
    def timed_seconds(self) -> float | None:
        """How long its training took for planning another: on the CPU the lesser of its wall
        and CPU seconds (with one torch thread the CPU time leaves out what other work on the
        machine took from the run; with several it exceeds the wall time), on a GPU the wall
        time (its host thread waits on the device)."""
        wall, cpu = self.train_seconds, self.train_cpu_seconds
        if wall is None or cpu is None or not (self.device or "cpu").startswith("cpu"):
            return wall
        return min(wall, cpu)

    @property
    def measured(self) -> Measured:
        """What its study measured of the model (:class:`Measured`)."""
        return Measured(self.measures, self.curves)

    def to_json(self) -> str:
        data = asdict(self)
        for name in ("ablation", "study", "measures", "curves"):  # older lines as they were
            if not data[name]:
                del data[name]
        cpu = data.pop("train_cpu_seconds")
        if cpu is not None:  # beside the wall time it qualifies
            items = list(data.items())
            items.insert(list(data).index("train_seconds") + 1, ("train_cpu_seconds", cpu))
            data = dict(items)
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LedgerRecord:
        """Validate one decoded line; raises ``ValueError`` naming the first bad field."""
        if not isinstance(data, Mapping):
            raise ValueError("a record is a JSON object")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}")
        missing = [n for n in names if n not in data and n not in _OPTIONAL]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        for name in ("system", "method", "config_hash"):
            if not isinstance(data[name], str) or not data[name]:
                raise ValueError(f"{name} must be a non-empty string")
        for name in ("commit", "numerics", "device", "hardware", "run_id"):
            if data[name] is not None and not isinstance(data[name], str):
                raise ValueError(f"{name} must be a string or null")
        for name in ("note", "ablation", "study"):
            if not isinstance(data.get(name, ""), str):
                raise ValueError(f"{name} must be a string")
        measures = data.get("measures", {})
        if not isinstance(measures, Mapping) or not all(
            isinstance(k, str) and finite(v) for k, v in measures.items()
        ):
            raise ValueError(f"measures must map names to finite numbers, got {measures!r}")
        curves = checked_curves(data.get("curves", {}))
        for name in ("seed", "epochs", "best_epoch"):
            v = data[name]
            if v is None and name != "seed":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        for name in ("test_rmse", "best_val_rmse", "rmse_without_top", "top_share"):
            v = data[name]
            if v is None and name != "test_rmse":
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
            if v < 0 or (name == "top_share" and v > 1):  # a negative RMSE too
                raise ValueError(f"{name} out of range: {v!r}")
        for name in ("train_seconds", "train_cpu_seconds"):
            v = data.get(name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf
            ):
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")
        return cls(**{**{n: data[n] for n in names if n in data}, "curves": curves})


def read_ledger(
    path: str | Path = DEFAULT_LEDGER, scope: LedgerScope | None = None
) -> list[LedgerRecord]:
    """Every record of the ledger at ``path`` in file order (none if the file is absent).

    Raises :class:`LedgerError` naming ``path:line`` for a line that is not a valid record, for
    a duplicate (the same cell, config hash and numerics as an earlier line) and, given the
    ledger's ``scope``, for a record it cannot place (an unknown system, method or ablation, a
    seed outside the profile's)."""
    path = Path(path)
    if not path.exists():
        return []
    if path.is_dir():
        raise LedgerError(f"{path}: is a directory, not a ledger file")
    records: list[LedgerRecord] = []
    first: dict[tuple, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = LedgerRecord.from_mapping(json.loads(line))
        except (ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
            raise LedgerError(f"{path}:{number}: not a valid ledger record: {e}") from None
        if scope is not None and (problem := scope.problem(record)) is not None:
            raise LedgerError(f"{path}:{number}: {problem} ({record.cell_key})")
        if record.key in first:
            raise LedgerError(
                f"{path}:{number}: duplicate of line {first[record.key]} "
                f"({record.cell_key}, config {record.config_hash[:12]})"
            )
        first[record.key] = number
        records.append(record)
    return records


def append_records(path: str | Path, records: Iterable[LedgerRecord]) -> list[LedgerRecord]:
    """Append the ``records`` the ledger does not hold yet, each line flushed to disk before
    the next (a killed process leaves whole lines); returns those appended.

    Several processes may append at once: the file is locked and re-read under the lock."""
    from tasks.machine import exclusive

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(path):  # the ledger file itself: no lock file beside it in the repository
        held = {r.key for r in read_ledger(path)}
        new = []
        for r in records:
            if r.key not in held:
                held.add(r.key)
                new.append(r)
        if new:
            # A file whose last line lacks its newline (an editor) gets one first.
            prefix = ""
            if path.exists() and path.stat().st_size:
                with path.open("rb") as f:
                    f.seek(-1, os.SEEK_END)
                    prefix = "" if f.read(1) == b"\n" else "\n"
            with path.open("a", encoding="utf-8") as f:
                f.write(prefix)
                for r in new:
                    f.write(r.to_json() + "\n")
                    f.flush()
                    os.fsync(f.fileno())
    return new


def _int(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else int(value)


def record_of_run(
    cell: LedgerCell,
    run_id: str,
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    *,
    hardware: str,
    numerics: str | None = None,
    measured: Measured | None = None,
) -> LedgerRecord:
    """The ledger record of ``cell``'s finished run (its final metrics and tags as the cell
    path logs them: :func:`tasks.pipeline.cell_metrics`, :func:`tasks.pipeline.evaluate_cell`;
    ``device_used``: ``cpu`` or ``cuda``, ``hardware``: that device's name; ``measured``: what
    the cell's study measured of its model, :attr:`LedgerCell.measure`)."""
    from tasks.tracking.tags import RunTags

    def metric(name: str) -> float | None:
        v = metrics.get(name)
        return None if v is None or not math.isfinite(v) else float(v)

    test = metric(Metrics.TEST_RMSE)
    if test is None:
        raise ValueError(f"run {run_id} of {cell.label} has no finite test_rmse")
    return LedgerRecord(
        system=cell.system,
        method=cell.method,
        seed=cell.seed,
        config_hash=cell.config_hash,
        commit=tags.get(RunTags.GIT_COMMIT) or None,
        numerics=numerics,
        test_rmse=test,
        best_val_rmse=metric(Metrics.BEST_VAL_RMSE),
        rmse_without_top=metric(Metrics.TEST_RMSE_WITHOUT_TOP),
        top_share=metric("test_top_share"),
        epochs=_int(metrics.get(Metrics.EPOCHS_RUN)),
        best_epoch=_int(metrics.get(Metrics.BEST_EPOCH)),
        train_seconds=metric(Metrics.TRAIN_SECONDS),
        train_cpu_seconds=metric(Metrics.TRAIN_CPU_SECONDS),
        device=tags.get("device_used") or None,
        hardware=hardware,
        run_id=run_id,
        note="diverged: never registered" if metrics.get(Metrics.DIVERGED) else "",
        ablation=cell.ablation,
        study=cell.study,
        measures=dict(measured.measures if measured else {}),
        curves=dict(measured.curves if measured else {}),
    )


@dataclass(frozen=True)
class LedgerCell:
    """One cell of the ledger as today's code defines it."""

    system: str
    method: str
    seed: int
    config_hash: str
    #: today's ``numerics`` (:func:`tasks.ledger.numerics_of`), None where not computed
    numerics: str | None
    #: "" for Table 3, else its key in :data:`ABLATIONS`; in a study, how the cell differs from
    #: the profile's cell of its system, method and seed (``data.noise_std=0.1``; "" when it is
    #: that cell: the same config hash, so the same record counts)
    ablation: str = ""
    #: "" for Table 3, its ablation and the peers, else the study whose table it is a cell of
    study: str = ""
    #: what a record of it must have measured besides the test RMSE, a measure's or a curve's
    #: name (:meth:`Measured.has`; "" for nothing)
    measure: str = ""

    @property
    def peer(self) -> bool:
        """A cell of a Laplace-domain peer (:data:`PEERS`), not Table 3's."""
        return not self.ablation and not self.study and self.method in PEERS

    @property
    def ablated(self) -> bool:
        """A cell of an ablation beside Table 3 (:data:`ABLATIONS`), not a study's."""
        return bool(self.ablation) and not self.study

    @property
    def table3(self) -> bool:
        """A cell of Table 3: neither an ablation's, a study's nor a peer's."""
        return not self.ablation and not self.study and not self.peer

    @property
    def row(self) -> str:
        """The method with its study and ablation (or variant) (:func:`row_label`)."""
        return row_label(self.method, self.ablation, self.study)

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.system, self.method, self.study, self.ablation, self.seed)

    @property
    def label(self) -> str:
        return cell_label(self.system, self.method, self.seed, self.ablation, self.study)


@dataclass(frozen=True)
class LedgerScope:
    """The ledger's cells (Table 3, then the ablations, the studies and the peers) and what a
    record may name."""

    cells: tuple[LedgerCell, ...]
    #: the profile's seeds (a config file may set others)
    seeds: tuple[int, ...]
    systems: frozenset[str]
    methods: frozenset[str]
    #: the studies whose cells it holds (a record of another study cannot be placed; empty: a
    #: scope computed without the studies, which does not judge their records)
    studies: frozenset[str] = frozenset()

    def select(
        self,
        systems: Iterable[str] | None = None,
        methods: Iterable[str] | None = None,
        seeds: Iterable[int] | None = None,
        *,
        ablations: bool | None = False,
        peers: bool | None = False,
        studies: bool | Iterable[str] = False,
    ) -> list[LedgerCell]:
        """The cells of the selection (None: all); ``ablations`` False: Table 3 only, True:
        the ablations only, None: both; ``peers`` (:data:`PEERS`) False: none of theirs, True:
        theirs only, None: theirs besides what ``ablations`` selects; ``studies`` (the paper's
        other tables) False: none, True: every study's besides the rest, names: those studies'
        cells only."""
        want = [set(x) if x is not None else None for x in (systems, methods, seeds)]
        named = None if isinstance(studies, bool) else frozenset(studies)

        def part(c: LedgerCell) -> bool:
            if c.study:
                return studies is True or (named is not None and c.study in named)
            if named is not None:
                return False
            if c.peer:
                return peers is not False
            return peers is not True and (ablations is None or bool(c.ablation) == ablations)

        return [
            c
            for c in self.cells
            if all(w is None or v in w for w, v in zip(want, (c.system, c.method, c.seed)))
            and part(c)
        ]

    def problem(self, record: LedgerRecord) -> str | None:
        """Why ``record`` cannot be placed in this ledger (None when it can)."""
        if record.system not in self.systems:
            return f"unknown system {record.system!r}"
        if record.method not in self.methods:
            return f"unknown method {record.method!r}"
        if record.seed not in self.seeds:
            return f"seed {record.seed} is not one of the profile's seeds {_seeds(self.seeds)}"
        if record.study:  # (a scope computed without the studies leaves their records be)
            if self.studies and record.study not in self.studies:
                known = ", ".join(sorted(self.studies))
                return f"unknown study {record.study!r} (known: {known})"
        elif record.ablation and record.ablation not in ABLATIONS:
            return f"unknown ablation {record.ablation!r} (known: {', '.join(ABLATIONS)})"
        return None


def _seeds(seeds: Sequence[int]) -> str:
    s = sorted(seeds)
    if s == list(range(s[0], s[-1] + 1)) and len(s) > 2:
        return f"{s[0]}-{s[-1]}"
    return ", ".join(map(str, s))
