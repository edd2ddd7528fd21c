"""The MLflow ``pyfunc`` face of a saved model, logged as *model code* (no pickle).

MLflow runs this file when it loads the model (``mlflow.pyfunc.load_model``); the weights travel
as the artifact ``weights`` (the folder :func:`tasks.modelio.save_model` writes) and are read
weights-only. ``predict`` takes a dict of arrays in physical units, ``obs_t`` ``[n, T]``,
``obs_x`` ``[n, T, D]`` and ``query_t`` ``[n, Tq]``, and returns the extrapolation
``[n, Tq, D]`` (see :func:`tasks.modelio.forecast`).
"""

from __future__ import annotations

import warnings

import mlflow
from mlflow.pyfunc import PythonModel

# MLflow asks for type hints on ``predict`` when the class is defined; the model's signature
# (logged with it) already describes and validates its inputs.
warnings.filterwarnings("ignore", message=".*type hints to the `predict` method.*")


class ForecastPyfunc(PythonModel):
    """A Neural Laplace Lab forecaster behind MLflow's ``pyfunc`` interface."""

    def load_context(self, context) -> None:
        from tasks.modelio import load_model

        self.model, self.spec = load_model(context.artifacts["weights"])

    def predict(self, context, model_input, params=None):
        from tasks.modelio import forecast

        return forecast(self.model, self.spec, model_input)


mlflow.models.set_model(ForecastPyfunc())
