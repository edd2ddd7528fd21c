"""``--device cuda`` without CUDA: every command that computes refuses it at once (exit 2, one
line naming the problem), before Prefect, the data or torch load."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from flows.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]

#: A command line of each command that computes and takes ``--device`` (checked to be all).
ARGV = {
    "benchmark": ["benchmark", "--profile", "smoke"],
    "study": ["study", "noise"],
    "tune": ["tune", "--method", "node", "--system", "integro_de", "--trials", "1"],
    "ledger": ["ledger", "run"],
}

#: Runs each command line in one fresh process; what it returned, the CPU seconds it took
#: (unlike wall-clock seconds, not stretched by other processes on a loaded machine), and
#: whether torch or Prefect were loaded by then.
_RUN = """
import json, sys, time
from flows.cli import main
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    t0 = time.process_time()
    code = main([*argv, "--device", "cuda"])
    results[name] = [code, time.process_time() - t0]
print(json.dumps({"results": results, "loaded": sorted(
    m for m in ("torch", "prefect", "mlflow") if m in sys.modules)}))
"""


def _computing_commands_with_device() -> set[str]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        name
        for name, parser in sub.choices.items()
        if parser.get_default("computes")
        and any("--device" in a.option_strings for a in parser._actions)
    }


def test_every_command_that_computes_and_takes_device_is_checked_here():
    assert _computing_commands_with_device() == set(ARGV)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_device_cuda_without_cuda_is_refused_at_once_by_every_command(tmp_path):
    env = {**os.environ, "NLLAB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(ARGV)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["loaded"] == []  # refused before torch, Prefect or MLflow loads
    errors = out.stderr.strip().splitlines()
    assert len(errors) == len(ARGV), errors  # one line each
    for (name, (code, seconds)), line in zip(got["results"].items(), errors, strict=True):
        assert code == 2 and seconds < 2.0, (name, code, seconds)
        assert line.startswith(f"nllab {name}: error: device 'cuda' was requested but CUDA")
        assert "is a CPU build" in line and "--device cpu" in line
    assert not (tmp_path / "home").exists()  # nothing created


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_ledger_run_device_cuda_exits_2_in_under_2_seconds_of_its_own(tmp_path):
    """The console command as a user types it: its own time beyond the interpreter's start and
    the command line's imports (what `nllab --help` takes too), in CPU seconds: wall-clock
    seconds grow with whatever else the machine runs, the command's own work does not."""
    env = {**os.environ, "NLLAB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}

    def timed(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
        command = [sys.executable, "-m", "flows.cli", *argv]
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)  # the child's own CPU time, as it ends
            proc.returncode = os.waitstatus_to_exitcode(status)
            err.seek(0)
            run = subprocess.CompletedProcess(command, proc.returncode, None, err.read())
        return run, usage.ru_utime + usage.ru_stime

    refused, seconds = timed("ledger", "run", "--device", "cuda")
    _, baseline = timed("ledger", "run", "--device", "bogus")  # argparse's own refusal
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "CUDA is not available" in refused.stderr
    # importing torch alone takes about 1.8 CPU seconds (measured on a Xeon): past this bound
    assert seconds - baseline < 1.0, (seconds, baseline)
