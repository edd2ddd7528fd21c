"""An opened study in one process: its storage, the data set it trains on, its tracking, and
the loop that runs trials until the study holds its trial count (shared with other processes
through the storage)."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterable
from datetime import datetime, timedelta

import optuna
from optuna.trial import FrozenTrial, TrialState

from nltrain import select_device, torch_threads
from tasks.cell import CellRuntime, simulate_data
from tasks.stopping import release_stop
from tasks.tracking import claim_owner, connect, owner_gone
from tasks.tuning.search_spaces import paper_params, search_space
from tasks.tuning.spec import OWNER_ATTR, TuneSpec, TuningError
from tasks.tuning.storage import (
    default_storage_url,
    grace_seconds,
    has_heartbeat,
    open_storage,
    open_study,
)
from tasks.tuning.trials import QuietSurplus, StudyFull, run_trial

__all__ = ["TuneSession"]


class TuneSession:
    """The study of ``spec`` opened (or created) in this process, with its data and tracking.

    Trials hang under the MLflow run ``parent_run_id``: a Dask shard is given it, otherwise
    :func:`tasks.tuning.study_parent_run` chooses it and :meth:`attach` links the session to it.
    """

    def __init__(self, spec: TuneSpec, parent_run_id: str | None = None) -> None:
        search_space(spec.method)  # unknown method: clear error before anything is created
        self.spec = spec
        self.config = spec.run_config()
        self.cell = self.config.cells()[0]
        self.storage_url = spec.storage or default_storage_url()
        self.storage = open_storage(
            self.storage_url,
            heartbeat_seconds=spec.heartbeat_seconds,
            grace_seconds=spec.grace_seconds,
        )
        self.study = open_study(spec, self.storage, self.cell.training.epochs)
        select_device(spec.device)  # CUDA asked for but absent: a clear error up front
        ds = simulate_data(self.cell.system, self.cell.data, self.cell.seed)
        self.dataset_hash = ds.fingerprint
        self.tracking = connect(self.config.tracking)
        self.parent_run_id: str | None = None
        self.runtime: CellRuntime | None = None
        if parent_run_id is not None:
            self.attach(parent_run_id)

    def attach(self, parent_run_id: str) -> None:
        """Log this session's trials under the MLflow run ``parent_run_id``."""
        self.parent_run_id = parent_run_id
        self.runtime = CellRuntime.for_config(
            self.tracking.store, self.config, parent_run_id, device=self.spec.device, progress=False
        )

    # -- the study's trials ---------------------------------------------------------------------
    def counts(self) -> dict[TrialState, int]:
        trials = self.study.get_trials(deepcopy=False)
        return {s: sum(t.state == s for t in trials) for s in TrialState}

    def remaining(self) -> int:
        c = self.counts()
        return max(0, self.spec.n_trials - c[TrialState.COMPLETE] - c[TrialState.PRUNED])

    def enqueue_paper_point(self) -> None:
        if self.spec.start_from_paper and not self.study.trials:
            self.study.enqueue_trial(paper_params(self.spec.method), user_attrs={"origin": "paper"})

    def objective(self, trial: optuna.Trial) -> float:
        assert self.runtime is not None  # optimize, its one caller, refuses to run without it
        return run_trial(trial, self.spec, self.cell, self.tracking.runs, self.runtime)

    def optimize(self, n_trials: int, n_jobs: int) -> None:
        if n_trials <= 0:
            return
        if self.runtime is None:
            raise TuningError("no parent run to log trials under: run them in study_parent_run")
        # the trials' torch threads once around them all (Optuna's n_jobs runs trials in
        # threads of this process), and this process's own put back afterwards
        with torch_threads(self.runtime.cpu_threads()):
            self._optimize(n_trials, n_jobs)

    def _optimize(self, n_trials: int, n_jobs: int) -> None:
        self.fail_dead_trials()
        total = self.spec.n_trials
        counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        # A surplus trial is expected when processes share the study: no warning with traceback.
        quiet = QuietSurplus()

        def within_total(trial: optuna.Trial) -> float:
            # The trial has started (OwnedStudy.ask held stop signals until here): a held
            # Ctrl-C or SIGTERM is raised now, and Optuna ends the trial FAIL.
            release_stop()
            # Other processes may share the study: the storage numbers trials uniquely, so the
            # trials counted before this one decide whether it is one too many.
            before = self.study.get_trials(deepcopy=False, states=counted)
            if sum(t.number < trial.number for t in before) >= total:
                self.study.stop()
                quiet.numbers.add(trial.number)
                trial.set_user_attr("surplus", True)
                raise StudyFull(f"the study already holds its {total} trials")
            return self.objective(trial)

        def stop_when_full(study: optuna.Study, _: FrozenTrial) -> None:
            if len(study.get_trials(deepcopy=False, states=counted)) >= total:
                study.stop()

        optuna_log = logging.getLogger("optuna.study._optimize")
        optuna_log.addFilter(quiet)
        self.study.hold_starts = True
        try:
            self.study.optimize(
                within_total,
                n_trials=n_trials,
                n_jobs=n_jobs,
                # Any other error fails only its trial; the study goes on (the run keeps it).
                catch=(Exception,),
                callbacks=[stop_when_full],
                gc_after_trial=False,
            )
        except KeyboardInterrupt:
            self.fail_own_trials()  # one Optuna left RUNNING (stopped as it recorded the end)
            raise
        finally:
            self.study.hold_starts = False
            optuna_log.removeFilter(quiet)
            release_stop()  # a hold the objective did not end (an error between the two)

    def fail_dead_trials(self) -> list[int]:
        """Fail (and re-enqueue) the RUNNING trials whose process is gone: at once for a process
        of this host that has ended, by heartbeat (no beat for the grace period) for any other,
        and, for a trial that names no process and never sent a heartbeat (its process stopped
        as the trial started), once it started longer ago than the grace period.
        Returns the numbers of the trials failed here."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        started_before = datetime.now() - timedelta(seconds=grace_seconds(self.storage))

        def dead(t: FrozenTrial) -> bool:
            if owner := t.user_attrs.get(OWNER_ATTR):
                return owner_gone(owner)
            old = t.datetime_start is not None and t.datetime_start < started_before
            return old and not has_heartbeat(self.storage, t._trial_id)

        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return self._fail_and_requeue(t for t in running if dead(t))

    def fail_own_trials(self) -> list[int]:
        """Fail (and re-enqueue) the RUNNING trials of this process (after it was stopped, while
        none of its trials runs any more); their numbers."""
        here = claim_owner().rsplit("/", 1)[0]
        return self._fail_and_requeue(
            t
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if str(t.user_attrs.get(OWNER_ATTR, "")).rsplit("/", 1)[0] == here
        )

    def _fail_and_requeue(self, trials: Iterable[FrozenTrial]) -> list[int]:
        """Fail each of ``trials`` and queue its configuration again (the parameters it drew,
        else those it was queued with), so that the study still runs its count."""
        failed = []
        for t in list(trials):
            try:
                self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except RuntimeError:
                continue  # finished (or failed by another process) meanwhile
            failed.append(t.number)
            self.study.enqueue_trial(
                t.params or t.system_attrs.get("fixed_params", {}),
                user_attrs={"origin": str(t.user_attrs.get("origin", "sampler"))},
            )
        return failed

    def run_to_total(self) -> None:
        """Run trials until the study holds ``spec.n_trials`` finished (complete or pruned)
        ones. A trial RUNNING in another process keeps its place while it runs; should the study
        still fall short once this process's trials are done (that trial failed, or its process
        died), this process waits for those trials (failing them by heartbeat once stale) and
        runs the missing ones, for as long as each round adds a finished trial."""
        self.optimize(self.remaining(), self.spec.n_jobs)
        while (missing := self.remaining()) > 0:
            if self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                time.sleep(min(self.spec.heartbeat_seconds, 5))
                self.fail_dead_trials()
                continue
            self.optimize(missing, self.spec.n_jobs)
            if self.remaining() == missing:
                return  # every trial of the round failed: the study ends short, as reported
