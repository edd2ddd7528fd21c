"""The MLflow ``pyfunc`` face of a saved model, logged as *model code* (no pickle).

MLflow runs this file when it loads the model (``mlflow.pyfunc.load_model``); the weights travel
as the artifact ``weights`` (the folder :func:`tasks.modelio.save_model` writes) and are read
weights-only. ``predict`` takes a dict of arrays in physical units, ``obs_t`` ``[n, T]``,
``obs_x`` ``[n, T, D]`` and ``query_t`` ``[n, Tq]``, and returns the extrapolation
``[n, Tq, D]`` (see :func:`tasks.modelio.forecast`).
"""

from __future__ import annotations

from typing import Any

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel


class ForecastPyfunc(PythonModel):
    """A Neural Laplace Lab forecaster behind MLflow's ``pyfunc`` interface."""

    #: MLflow's type-hint validation takes ``list[...]`` inputs only; this model takes one dict
    #: of arrays, which the tensor signature logged with it validates (names, shapes, dtype).
    #: MLflow's own switch for such models: the signature validates. ``model_input`` has no
    #: hint for the same reason: MLflow would try to infer a signature from it as it logs the
    #: model and warn that it cannot.
    _skip_type_hint_validation = True

    def load_context(self, context) -> None:
        from tasks.modelio import load_model

        self.model, self.spec = load_model(context.artifacts["weights"])

    def predict(
        self,
        context,
        model_input,  # {"obs_t": [n, T], "obs_x": [n, T, D], "query_t": [n, Tq]} arrays
        params: dict[str, Any] | None = None,
    ) -> np.ndarray:
        from tasks.modelio import forecast

        return forecast(self.model, self.spec, model_input)


mlflow.models.set_model(ForecastPyfunc())
