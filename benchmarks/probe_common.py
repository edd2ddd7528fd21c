"""What the reliability probes (``benchmarks/reliability.py`` and its third pass,
``benchmarks/reliability_third.py``) share: the repository, a probe's environment and scratch
folders, and how a probe's row is judged and printed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["ROOT", "fresh_dir", "one_clear_line", "print_row", "probe_env"]

ROOT = Path(__file__).resolve().parent.parent


def probe_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(home)}
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT", "PREFECT_API_URL", "PREFECT_HOME"):
        env.pop(var, None)
    return env


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def print_row(name: str, ok: bool, detail: str) -> bool:
    print(f"  {'pass' if ok else 'FAIL'}  {name:<34} {detail}", flush=True)
    return ok


def one_clear_line(r: subprocess.CompletedProcess, codes: tuple[int, ...]) -> tuple[bool, str]:
    """Exit code in ``codes``, no traceback, and one ``error:`` line (continuation lines of one
    error, indented, are allowed)."""
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    ok = r.returncode in codes and "Traceback" not in r.stdout + r.stderr and len(errors) == 1
    return ok, f"exit {r.returncode}, tracebacks {r.stderr.count('Traceback')}: " + (
        errors[0][:100] if errors else r.stderr.strip()[-100:]
    )
