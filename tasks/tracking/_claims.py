"""Cell claims of the MLflow adapter: one process at a time trains a cell.

A claim on a config hash is the param ``claim.<hash>.<generation>`` of one "claims" run. Params
are write-once in every MLflow store (a second value for the same key is refused by the
database's unique key), so exactly one owner wins each generation, on sqlite, Postgres or a
tracking server alike. The tag ``claim.<hash>.<generation>.beat`` holds the owner's latest
heartbeat (epoch seconds) or ``released``; a stale or released generation is taken over by
claiming the next one. The generation is the claim's fencing token: a holder writes a cell's
final state only while its generation is still the newest (:meth:`CellClaims.holds_cell`).

The claims run lives in a bookkeeping experiment of its own (``nllab-bookkeeping-<id>``, one per
experiment), so a user browsing the experiment's runs never sees it; every host of a shared
tracking server finds it by that name. Owners name a host and a process (pid and start time),
so the claim of a process of this host that has ended is taken over at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from mlflow.exceptions import MlflowException

from tasks.tracking._store import Store
from tasks.tracking.processes import host_id, owner_gone, process_alive
from tasks.tracking.tags import RunTags

__all__ = ["CLAIM_STALE_AFTER", "CellClaims"]


def _stale_after_from_env(default: float = 600.0) -> float:
    try:
        value = float(os.environ.get("NLLAB_CLAIM_STALE_SECONDS") or default)
    except ValueError:
        return default
    return value if value > 0 else default


#: Seconds without a heartbeat after which another process may take over a claimed cell
#: (``NLLAB_CLAIM_STALE_SECONDS`` overrides the 600 s, e.g. for fault probes).
CLAIM_STALE_AFTER = _stale_after_from_env()


_CLAIMS_KIND = "claims"
#: Serialises finding (or creating) the claims run among the threads of one process.
_CLAIMS_LOCK = threading.Lock()
_BOOKKEEPING_PREFIX = "nllab-bookkeeping-"


class _Claim(NamedTuple):
    generation: int
    owner: str
    at: float  # when it was claimed (epoch seconds)
    beat: float | None  # the owner's last heartbeat; None once released


def _claim_state_in(claims, config_hash: str) -> _Claim | None:
    """The newest claim on ``config_hash`` in the claims run's data."""
    prefix = f"claim.{config_hash}."
    gens = [int(k[len(prefix) :]) for k in claims.params if k.startswith(prefix)]
    if not gens:
        return None
    g = max(gens)
    record = json.loads(claims.params[f"{prefix}{g}"])
    beat = claims.tags.get(f"{prefix}{g}.beat", repr(record["at"]))
    return _Claim(
        g, record["owner"], float(record["at"]), None if beat == "released" else float(beat)
    )


def _abandoned_cell_run(run, claims, stale_after: float) -> bool:
    """Whether ``run`` is a cell run whose process lost its cell's claim: no heartbeat for
    ``stale_after`` seconds, or the claim taken over by another process since the run began."""
    tags = run.data.tags
    config_hash = tags.get(RunTags.CONFIG_HASH)
    if tags.get(RunTags.KIND) != "cell" or not config_hash:
        return False
    state = _claim_state_in(claims, config_hash)
    if state is None:
        return False
    if state.owner.split("/")[:2] == [tags.get(RunTags.HOST), tags.get(RunTags.PROCESS)]:
        return state.beat is not None and time.time() - state.beat > stale_after
    return state.at * 1000 > run.info.start_time


class CellClaims:
    """Cell claims, heartbeats and fencing, kept in the bookkeeping experiment; and the ending
    of runs whose process is gone (judged by their process or their cell's claim)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._client = store.client
        self._claims_run_id: str | None = None

    def _bookkeeping_experiment(self) -> str:
        """The bookkeeping experiment's id, made if absent; its description (the MLflow UI's,
        the ``mlflow.note.content`` tag) says what it is, also on one an older version made."""
        name = f"{_BOOKKEEPING_PREFIX}{self._store.experiment_id}"
        note = (
            f"nllab's own bookkeeping for experiment {self._store.settings.experiment!r} (id "
            f"{self._store.experiment_id}): which process trains which cell (cell claims and "
            "their heartbeats), so that two processes never train one cell. No results here: "
            f"they are in {self._store.settings.experiment!r}. Leave it be; deleting it while "
            "nllab runs lets a cell be trained twice (docs/guide/tracking.md)."
        )
        exp = self._client.get_experiment_by_name(name)
        if exp is not None:
            if exp.tags.get(RunTags.NOTE) != note:
                self._client.set_experiment_tag(exp.experiment_id, RunTags.NOTE, note)
            return exp.experiment_id
        try:
            return self._client.create_experiment(
                name,
                artifact_location=self._store.settings.artifact_root,
                tags={RunTags.NOTE: note, RunTags.KIND: "bookkeeping"},
            )
        except MlflowException:
            exp = self._client.get_experiment_by_name(name)  # created meanwhile by another
            if exp is None:
                raise
            return exp.experiment_id

    def _claims_run(self) -> str:
        if self._claims_run_id is None:
            with _CLAIMS_LOCK:  # threads of one process: one finds or creates it, once
                if self._claims_run_id is None:
                    self._claims_run_id = self._find_or_create_claims_run()
        return self._claims_run_id

    def _find_or_create_claims_run(self) -> str:
        """The bookkeeping experiment's claims run, created if absent: one per experiment.

        A server store has no file lock: processes that create it at once settle on the oldest,
        and each deletes the one it made if that is not it."""
        query = f"tags.`{RunTags.KIND}` = '{_CLAIMS_KIND}'"
        exp_id = self._bookkeeping_experiment()
        runs = self._client.search_runs([exp_id], query, max_results=100)
        created = None
        if not runs:
            with self._store.lock():
                runs = self._client.search_runs([exp_id], query, max_results=100)
                if not runs:
                    run = self._client.create_run(
                        exp_id, run_name="nllab-claims", tags={RunTags.KIND: _CLAIMS_KIND}
                    )
                    created = run.info.run_id
                    self._store.end_run(created, "FINISHED")  # bookkeeping, never "running"
                    runs = self._client.search_runs([exp_id], query, max_results=100)
        first = min(runs, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
        if created is not None and created != first:
            with contextlib.suppress(MlflowException):  # nothing was claimed in it
                self._client.delete_run(created)
        return first

    def retire_old_claims_runs(self) -> list[str]:
        """Delete (MLflow's soft delete: hidden, restorable) the claims runs that older versions
        kept in the experiment itself; their claims are ignored (a cell claimed only there can be
        claimed again at once). Their ids."""
        old = [
            r.info.run_id for r in self._store.search(f"tags.`{RunTags.KIND}` = '{_CLAIMS_KIND}'")
        ]
        for run_id in old:
            with contextlib.suppress(MlflowException):  # deleted meanwhile by another process
                self._client.delete_run(run_id)
        return old

    def claims_data(self):
        return self._client.get_run(self._claims_run()).data

    def _claim_state(self, config_hash: str) -> _Claim | None:
        """The newest claim on ``config_hash``, or ``None``."""
        return _claim_state_in(self.claims_data(), config_hash)

    def _beat(self, config_hash: str, generation: int, value: str) -> None:
        self._store.set_tags(self._claims_run(), {f"claim.{config_hash}.{generation}.beat": value})

    def claim_cell(
        self, config_hash: str, owner: str, *, stale_after: float = CLAIM_STALE_AFTER
    ) -> bool:
        """Claim the cell ``config_hash`` for ``owner`` (see :func:`claim_owner`); ``True`` if
        ``owner`` now holds it (also when it already did), ``False`` if another owner does.

        A claim is taken over when it was released, its owner's last heartbeat is older than
        ``stale_after`` seconds, or its owner is a process of this host that no longer exists.
        Of several owners claiming at once exactly one gets ``True``. The holder calls
        :meth:`heartbeat_cell` more often than every ``stale_after`` seconds while it works,
        and :meth:`release_cell` at the end (or uses :meth:`cell_claim`).
        """
        state = self._claim_state(config_hash)
        generation = 0
        if state is not None:
            if state.beat is not None:
                if state.owner == owner:
                    self._beat(config_hash, state.generation, repr(time.time()))
                    return True
                if time.time() - state.beat < stale_after and not owner_gone(state.owner):
                    return False
            generation = state.generation + 1
        key = f"claim.{config_hash}.{generation}"
        try:
            self._client.log_param(
                self._claims_run(), key, json.dumps({"owner": owner, "at": time.time()})
            )
        except MlflowException:
            # Refused: someone claimed this generation first (anything else is re-raised).
            state = self._claim_state(config_hash)
            if state is None or state.generation < generation:
                raise
            return state.generation == generation and state.owner == owner
        return True

    def heartbeat_cell(self, config_hash: str, owner: str) -> bool:
        """Renew ``owner``'s claim; ``False`` if it no longer holds it (taken over, released)."""
        state = self._claim_state(config_hash)
        if state is None or state.owner != owner or state.beat is None:
            return False
        self._beat(config_hash, state.generation, repr(time.time()))
        return True

    def holds_cell(self, config_hash: str, owner: str, generation: int | None = None) -> bool:
        """The fence before a cell's final write: whether ``owner`` still holds the newest claim
        on ``config_hash`` (of ``generation``, the fencing token of :meth:`claim_generation`,
        when given); if so the claim's heartbeat is renewed, so that no other process can take it
        over for the next ``stale_after`` seconds.

        A holder suspended (``SIGSTOP``, a laptop lid) past the stale time may have lost its
        claim to a process that trained the cell meanwhile: it must then not log the cell as
        FINISHED (which would give one config hash two finished runs).
        """
        state = self._claim_state(config_hash)
        if state is None or state.owner != owner or state.beat is None:
            return False
        if generation is not None and state.generation != generation:
            return False
        self._beat(config_hash, state.generation, repr(time.time()))
        return True

    def claim_generation(self, config_hash: str, owner: str) -> int | None:
        """The generation (fencing token) of ``owner``'s live claim on ``config_hash``, or
        ``None`` if it holds none."""
        state = self._claim_state(config_hash)
        if state is None or state.owner != owner or state.beat is None:
            return None
        return state.generation

    def claim_holder(self, config_hash: str) -> str | None:
        """Who holds the claim on ``config_hash``, for people: ``pid P on host H since T``
        (``T`` in UTC), or ``None`` when nobody holds it."""
        state = self._claim_state(config_hash)
        if state is None or state.beat is None:
            return None
        parts = state.owner.split("/")
        host = parts[0].split("[", 1)[0] if parts else state.owner
        pid = parts[1].split(":", 1)[0] if len(parts) > 1 else "?"
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.at))
        return f"pid {pid} on host {host} since {since}"

    def release_cell(self, config_hash: str, owner: str) -> None:
        """Give up ``owner``'s claim (no-op if it does not hold it)."""
        state = self._claim_state(config_hash)
        if state is not None and state.owner == owner and state.beat is not None:
            self._beat(config_hash, state.generation, "released")

    @contextmanager
    def cell_claim(
        self,
        config_hash: str,
        owner: str,
        *,
        stale_after: float = CLAIM_STALE_AFTER,
        interval: float | None = None,
    ) -> Iterator[bool]:
        """``with claims.cell_claim(h, owner) as mine:`` :meth:`claim_cell`, then (if ``mine``)
        a heartbeat every ``interval`` seconds (default ``stale_after / 4``) in a daemon thread
        while the block runs, and :meth:`release_cell` when it ends, however it ends."""
        if not self.claim_cell(config_hash, owner, stale_after=stale_after):
            yield False
            return
        done = threading.Event()

        def beat() -> None:
            while not done.wait(interval or stale_after / 4):
                with contextlib.suppress(Exception):  # a missed beat is retried next time
                    if not self.heartbeat_cell(config_hash, owner):
                        return

        thread = threading.Thread(target=beat, name=f"claim-{config_hash[:8]}", daemon=True)
        thread.start()
        try:
            yield True
        finally:
            done.set()
            thread.join()
            self.release_cell(config_hash, owner)

    def end_stale_runs(self, *, stale_after: float = CLAIM_STALE_AFTER) -> list[str]:
        """End KILLED every RUNNING run of the experiment that can never finish; their ids.

        Each run records its host and process when created (tags ``nllab.host`` and
        ``nllab.process``: pid and start time, so a recycled pid does not count as alive). A run
        started on this host by a process that no longer exists can never finish (``kill -9``,
        a power cut). Processes of other hosts cannot be asked, so a cell run of another host
        counts as abandoned through its cell's claim: its process stopped heart-beating for
        ``stale_after`` seconds, or another process took the claim over after the run started
        (a Dask worker killed mid-cell, its cell trained again elsewhere). Runs of live
        processes, and runs of other hosts that hold no claim (parents, tuning trials), are
        left alone.
        """
        host = host_id()
        claims = None
        ended = []
        for r in list(self._store.search("attributes.status = 'RUNNING'")):
            tags = r.data.tags
            token = tags.get(RunTags.PROCESS)
            if not token:
                continue
            if tags.get(RunTags.HOST) == host:
                if process_alive(token):
                    continue
            else:
                claims = claims if claims is not None else self.claims_data()
                if not _abandoned_cell_run(r, claims, stale_after):
                    continue
            self._store.set_tags(
                r.info.run_id, {RunTags.ERROR: f"process {token} ended without closing this run"}
            )
            self._store.end_run(r.info.run_id, "KILLED")
            ended.append(r.info.run_id)
        return ended
