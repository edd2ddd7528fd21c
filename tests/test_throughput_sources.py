"""The projection's timings say which were measured and which projected
(``benchmarks/throughput.py``, ``benchmarks/latent_ode_steps.py --project``)."""

from __future__ import annotations

import json

import pytest

from benchmarks.throughput import Timing, lookup, read_timings


def _rows() -> list[Timing]:
    return [
        Timing("node", "float64", "cuda", True, {1: 0.09, 5: 0.02, 30: 0.004}, {5: 0.17}),
        Timing(
            "latent_ode", "float64", "cuda", True, {1: 1.9, 5: 0.12, 30: 0.04}, {5: 0.4},
            projected=[5, 30],
        ),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "members", "source"),
    [
        ("node", 5, "measured"),
        ("node", 15, "interpolated ×5–×30"),
        ("latent_ode", 1, "measured"),  # the eager cell: timed on the GPU
        ("latent_ode", 5, "projected"),
        ("latent_ode", 15, "interpolated ×5–×30 (projected)"),
        ("latent_ode", 60, "extrapolated from ×30 (projected)"),
    ],
)
def test_a_timing_says_whether_it_rests_on_a_projection(model, members, source):
    assert lookup(_rows(), model, "float64", "cuda", members)[1] == source


def test_timings_without_projections_read_as_before(tmp_path):
    # A throughput file written before timings could be projected has no such field.
    (tmp_path / "t.json").write_text(
        json.dumps(
            {
                "timings": [
                    {
                        "model": "node", "dtype": "float64", "device": "cpu", "packable": True,
                        "seconds": {"1": 0.7}, "eager_packed": {}, "bytes_per_member": {},
                    }
                ]
            }
        )
    )  # fmt: skip
    (row,) = read_timings(tmp_path / "t.json")
    assert row.projected == [] and lookup([row], "node", "float64", "cpu", 1) == (0.7, "measured")
