"""One trial of a study: a cell trained on the suggested configuration as a nested MLflow run,
every epoch's validation RMSE reported to Optuna so that the pruner can stop it early."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import optuna

from tasks.cell import CellRuntime, fit_cells
from tasks.config import CellConfig, TrainConfig
from tasks.search_spaces import suggest
from tasks.tracking import RunTags, Tracker, claim_owner
from tasks.training import EpochRecord, TrainingDiverged
from tasks.tuning.spec import OWNER_ATTR, TuneSpec

__all__ = ["QuietSurplus", "StudyFull", "run_trial"]


class StudyFull(RuntimeError):
    """A trial drawn after the study reached its trial count (by another process): failed."""


class QuietSurplus(logging.Filter):
    """Drops Optuna's "trial failed" warnings (with traceback) about surplus trials."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            return False  # Ctrl-C or SIGTERM: the command says so once, without a traceback
        message = record.getMessage()
        return not any(message.startswith(f"Trial {n} failed") for n in self.numbers)


@contextmanager
def _trial_run(tracker: Tracker, name: str, tags: Mapping[str, str], parent: str) -> Iterator[str]:
    """A nested MLflow run that ends FINISHED (complete), KILLED (pruned) or FAILED."""
    run_id = tracker.create_run(name, tags, parent)
    try:
        yield run_id
    except optuna.TrialPruned as e:
        tracker.set_tags(run_id, {"optuna.state": "PRUNED", "pruned_reason": str(e)[:4000]})
        tracker.end_run(run_id, "KILLED")
        raise
    except BaseException as e:
        tracker.set_tags(
            run_id, {"optuna.state": "FAIL", RunTags.ERROR: f"{type(e).__name__}: {e}"}
        )
        tracker.end_run(run_id, "FAILED")
        raise
    tracker.set_tags(run_id, {"optuna.state": "COMPLETE"})
    tracker.end_run(run_id, "FINISHED")


def run_trial(
    trial: optuna.Trial, spec: TuneSpec, cell: CellConfig, tracker: Tracker, runtime: CellRuntime
) -> float:
    """Train ``cell`` with the trial's suggestion under the study's parent run
    (``runtime.parent_run_id``); returns its best validation RMSE. A diverging trial is pruned
    (the sampler then learns that this region is bad), any other error fails it."""
    s = suggest(trial, spec.method)
    cell = cell.model_copy(
        update={
            "model": {**cell.model, **s.model},
            "training": TrainConfig.model_validate({**cell.training.model_dump(), **s.training}),
        }
    )
    trial.set_user_attr("overrides", s.as_json())
    trial.set_user_attr(OWNER_ATTR, claim_owner())
    tags = {
        RunTags.KIND: "trial",
        RunTags.METHOD: spec.method,
        RunTags.SYSTEM: spec.system,
        RunTags.PROFILE: spec.profile,
        "optuna.study": spec.study_name,
        "optuna.trial": str(trial.number),
        "origin": str(trial.user_attrs.get("origin", "sampler")),
    }
    with _trial_run(tracker, f"trial-{trial.number}", tags, runtime.parent_run_id) as run:
        trial.set_user_attr("mlflow_run_id", run)
        tracker.log_params(run, {f"hp.{k}": v for k, v in trial.params.items()})

        def report(_member: int, r: EpochRecord) -> None:
            trial.report(r.val_rmse, r.epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at epoch {r.epoch}: val_rmse {r.val_rmse}")

        # The same set-up and training path as every benchmark cell; the test split is not
        # evaluated (the objective is the best validation RMSE).
        (out,) = fit_cells([cell], runtime, [run], on_epoch=report, evaluate_test=False)
        if isinstance(out, TrainingDiverged):
            trial.set_user_attr("diverged", str(out))
            raise optuna.TrialPruned(f"diverged: {out}") from out
        if isinstance(out, Exception):
            raise out
        result = out.train
        tracker.log_metrics(
            run,
            {
                "best_val_rmse": result.best_val_rmse,
                "best_epoch": result.best_epoch,
                "train_seconds": result.seconds,
            },
        )
        return result.best_val_rmse
