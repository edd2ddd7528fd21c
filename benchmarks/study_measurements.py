"""What the paper's studies measure without training, measured here and kept as committed records.

A timing is the machine's, not a model's: the seconds per epoch of Table 11 (``wallclock``) and
the ILT algorithms' accuracy and µs per point of Table 12 (``ilt``) are no cell's result, so the
results ledger keeps no record of them. This script runs each study's body at the paper's budget
with no cell trained (:func:`flows.studies.study_measurements`) and writes each table the body
measures to ``results/measurements/NAME.json`` (:data:`flows.studies.MEASUREMENTS`), with the
processor, its load and the commit: the study's ledger table (``nllab ledger table --study
NAME``, ``docs/results/studies/NAME.md``) is drawn from that record.

    PYTHONPATH=. python benchmarks/study_measurements.py [--record] [--studies ilt wallclock]
        [--seeds 0] [--torch-threads N]

``--seeds`` times fewer seeds than the paper profile's (the record says so); ``--torch-threads``
the threads each timing may use (default: the profile's, else torch's own).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows._study_catalog import STUDY_CATALOG
from flows.studies import MEASUREMENTS, measurement_rows, study_measurements
from tasks.reports.measurements import record_measurement

COMMAND = "PYTHONPATH=. python benchmarks/study_measurements.py --record"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", nargs="+", default=list(MEASUREMENTS), choices=list(MEASUREMENTS))
    ap.add_argument("--seeds", nargs="+", type=int, metavar="N", help="default: the profile's")
    ap.add_argument("--torch-threads", type=int, metavar="N")
    ap.add_argument("--record", action="store_true", help="write the measurement records")
    args = ap.parse_args()
    overrides = {"execution": {"torch_threads": args.torch_threads}} if args.torch_threads else {}
    for study in args.studies:
        t0 = time.perf_counter()
        tables = study_measurements(study, "paper", seeds=args.seeds, overrides=overrides)
        seconds = time.perf_counter() - t0
        entry = STUDY_CATALOG[study]
        for name, frame in tables.items():
            print(f"{study}: {name} ({seconds:.0f} s)\n{frame.to_string(index=False)}", flush=True)
            if not args.record:
                continue
            columns, rows = measurement_rows(frame)
            where = "on the device each row names" if "device" in columns else "on its CPU"
            options = f" --studies {study}"
            options += f" --seeds {' '.join(map(str, args.seeds))}" if args.seeds else ""
            options += f" --torch-threads {args.torch_threads}" if args.torch_threads else ""
            seeds = f"seeds {', '.join(map(str, args.seeds))} only; " if args.seeds else ""
            path = record_measurement(
                name,
                f"{entry.title} ({entry.paper_label}), measured without training at the paper's "
                "budget",
                COMMAND + options,
                columns,
                rows,
                note=f"{seeds}the study's own body measured it ({seconds:.0f} s in all); "
                f"timings are this machine's, {where}.",
            )
            print(f"recorded {path}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
