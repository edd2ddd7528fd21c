"""One trial of a study: a cell trained on the suggested configuration as a nested MLflow run,
every epoch's validation RMSE reported to Optuna so that the pruner can stop it early."""

from __future__ import annotations

import logging

import optuna

from nltrain import EpochRecord, TrainingDiverged
from tasks.cell import CellRuntime, fit_cells
from tasks.config import CellConfig, TrainConfig
from tasks.stopping import contained
from tasks.tracking import Metrics, RunLog, RunTags
from tasks.tuning.search_spaces import suggest
from tasks.tuning.spec import TuneSpec

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


def _trial_state(error: BaseException | None) -> dict[str, str]:
    """The Optuna state a trial's run is tagged with as it ends: complete, pruned (its run
    ends KILLED) or failed."""
    if error is None:
        return {"optuna.state": "COMPLETE"}
    if isinstance(error, optuna.TrialPruned):
        return {"optuna.state": "PRUNED", "pruned_reason": str(error)[:4000]}
    return {"optuna.state": "FAIL"}


def run_trial(
    trial: optuna.Trial, spec: TuneSpec, cell: CellConfig, runs: RunLog, runtime: CellRuntime
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
    tags = {
        RunTags.KIND: "trial",
        RunTags.METHOD: spec.method,
        RunTags.SYSTEM: spec.system,
        RunTags.PROFILE: spec.profile,
        "optuna.study": spec.study_name,
        "optuna.trial": str(trial.number),
        "origin": str(trial.user_attrs.get("origin", "sampler")),
    }
    with runs.run(
        f"trial-{trial.number}",
        tags,
        runtime.parent_run_id,
        killed_by=(optuna.TrialPruned,),
        outcome_tags=_trial_state,
    ) as run:
        trial.set_user_attr("mlflow_run_id", run)
        runs.log_params(run, {f"hp.{k}": v for k, v in trial.params.items()})

        def report(_member: int, r: EpochRecord) -> None:
            trial.report(r.val_rmse, r.epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at epoch {r.epoch}: val_rmse {r.val_rmse}")

        # The same set-up and training path as every benchmark cell; the test split is not
        # evaluated (the objective is the best validation RMSE).
        with contained():  # a plugin's sys.exit fails this trial, not the study
            (out,) = fit_cells([cell], runtime, [run], on_epoch=report, evaluate_test=False)
        if isinstance(out, TrainingDiverged):
            trial.set_user_attr("diverged", str(out))
            raise optuna.TrialPruned(f"diverged: {out}") from out
        if isinstance(out, Exception):
            raise out
        result = out.train
        runs.log_metrics(
            run,
            {
                Metrics.BEST_VAL_RMSE: result.best_val_rmse,
                Metrics.BEST_EPOCH: result.best_epoch,
                Metrics.TRAIN_SECONDS: result.seconds,
            },
        )
        return result.best_val_rmse
