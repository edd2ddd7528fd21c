"""``nllab study frequency-filter``: a low-pass Neural Laplace (|s| ≤ 3, ``max_frequency``)
trained on sin t + sin 2t corrupted by 0.5 sin 11t recovers the clean signal (paper Appendix C,
``frequencyfilter``, and its figure; no published number).

Both models are trained on the corrupted signal as ordinary cells (reused when finished); the
table reports the test RMSE against the clean signal (``value``) and against the corrupted one.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from prefect import flow

from flows.studies._core import (
    Study,
    StudyConfig,
    StudyContext,
    StudyOutput,
    StudySpec,
    StudySummary,
    add_paper,
    aggregate,
    execute_study,
)
from tasks.evaluation import rmse
from tasks.training import predict

SYSTEM = "noisy_sines"
MAX_FREQUENCY = 3.0
VARIANTS = (("unfiltered", None), ("low-pass s≤3", MAX_FREQUENCY))
SPEC = StudySpec(
    name="frequency-filter",
    title="Low-pass Neural Laplace on a corrupted signal",
    paper_ref="Appendix C (frequencyfilter) figure: the filtered model recovers the clean signal",
    metric="test RMSE to the clean signal",
)
KEYS = ("system", "variant")


def _body(ctx: StudyContext) -> StudyOutput:
    system = ctx.systems((SYSTEM,))[0]
    entries = [
        (
            {"system": system, "variant": name},
            ctx.cell(
                system, "neural_laplace", seed, model={} if mf is None else {"max_frequency": mf}
            ),
        )
        for name, mf in VARIANTS
        for seed in ctx.seeds
    ]
    results = ctx.run_cells([c for _, c in entries])
    clean, noisy, curves = [], [], {}
    for (lab, cell), r in zip(entries, results, strict=True):
        c_val = n_val = math.nan
        if r.ok:
            model, spec = ctx.load_model(r)
            test = ctx.prepared(cell).test
            pred = predict(model, test, dtype=spec.dtype, batch_size=cell.training.batch_size)
            c_val = float(rmse(pred, test.target_clean))
            n_val = float(rmse(pred, test.target))
            curves.setdefault(lab["variant"], (test, pred))
        clean.append({**lab, "value": c_val})
        noisy.append({**lab, "value": n_val})
    table = add_paper(aggregate(clean, KEYS), KEYS, SPEC.paper)
    table["rmse_to_corrupted"] = aggregate(noisy, KEYS)["value"].to_numpy()
    _plot(curves, ctx.figure("frequency_filter"))
    return StudyOutput({"frequency_filter": table})


def _plot(curves: dict, path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.4))
    if curves:
        test, _ = next(iter(curves.values()))
        ax.plot(test.obs_t, test.obs_x[0, :, 0], color="0.6", lw=1, label="observed (corrupted)")
        ax.plot(test.query_t, test.target[0, :, 0], color="0.6", lw=1, ls=":",
                label="corrupted")  # fmt: skip
        ax.plot(test.query_t, test.target_clean[0, :, 0], color="k", lw=1.5, label="clean")
        for i, (name, (t, pred)) in enumerate(curves.items()):
            ax.plot(t.query_t, np.asarray(pred)[0, :, 0], "--", color=f"C{i + 1}", label=name)
    ax.set_xlabel("t")
    ax.set_ylabel("x (normalised)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Frequency filter (Appendix C)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@flow(name="nllab-study-frequency-filter")
def frequency_filter_flow(config: StudyConfig) -> StudySummary:
    """Appendix C: RMSE to the clean signal with and without the low-pass filter."""
    return execute_study(SPEC, config, _body)


STUDY = Study(SPEC, frequency_filter_flow)
