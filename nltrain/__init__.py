"""The training floor: what turns a cell's data and configuration into weights and scores.

    from nltrain import TrainConfig, seeded, train, evaluate
    with seeded(0):
        model = build_model("node", state_dim=2)           # nlmodels
    result = train(model, prepared.train, prepared.val, TrainConfig(epochs=50))
    scores, forecast = evaluate(model, prepared.test, prepared.normaliser)

The one training loop over a declared step function (:func:`train_loop`, :class:`StepFunction`,
:func:`stop_reason`), one cell's eager step or a pack's batched one (:func:`train`,
:func:`train_packed`) and test scores (:func:`evaluate`). The numerics fingerprints that say
whether a stored cell's numbers are still today's, and the pinned bytes of the portable CPU
numerics, are the room :mod:`nltrain.numerics`.
It imports torch, numpy, pydantic (its settings), ``nlmodels`` and ``datasets``, never Prefect,
MLflow or Optuna: orchestration (cells, engine, tracking) is ``tasks``'.

Names load on first use (PEP 562): ``import nltrain`` imports neither torch nor pydantic, so the
command line, which imports :class:`Interrupted` through ``tasks.errors``, stays fast.
"""

from __future__ import annotations

from nlmodels.lazy import lazy_face

#: The private module that defines each public name.
_WHERE = {
    name: module
    for module, names in {
        "_checkpoints": "Checkpoints",
        "_config": "Settings TrainConfig",
        "_errors": "Interrupted TrainingDiverged TrainingInterrupted",
        "_evaluation": "Evaluation divergence evaluate outlier_census rmse",
        "_loop": "EpochRecord LoopOptions StepFunction StopReason TrainResult stop_reason "
        "train_loop",
        "_packing": "packable prefers_one_by_one train_packed",
        "_steps": "DTYPES as_tensor",
        "_threads": "torch_threads",
        "_training": "epoch_seconds predict seeded select_device step_function train",
    }.items()
    for name in names.split()
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_face(__name__, _WHERE)
