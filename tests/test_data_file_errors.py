"""A bad data file is one line naming the file and its problem, exit code 2, and nothing in the
store: each case through ``nllab benchmark`` (a few as the user runs it, in a subprocess; the
rest through :func:`flows.cli.main` in this process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _csv(path: Path, rows: list[tuple], header: str = "trajectory,t,a") -> Path:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def _good_rows(n: int = 4, steps: int = 6) -> list[tuple]:
    return [(i, round(0.1 * j, 3), float(i + j)) for i in range(n) for j in range(steps)]


def _config(tmp_path: Path, data: Path, extra: str = "") -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'systems = ["lab"]\nmethods = ["node"]\n[define_systems.lab]\nfile = "{data.name}"\n'
        + extra
    )
    return cfg


def _bad_cases(tmp: Path) -> dict[str, tuple[Path, str, str]]:
    """name -> (data file, extra declaration lines, expected problem text)."""
    rows = _good_rows()
    nan = [r if r[:2] != (1, 0.2) else (1, 0.2, "nan") for r in rows]
    inf = [r if r[:2] != (2, 0.3) else (2, 0.3, "inf") for r in rows]
    dup = [r if r[:2] != (0, 0.3) else (0, 0.2, r[2]) for r in rows]
    back = [r if r[:2] != (3, 0.3) else (3, 0.05, r[2]) for r in rows]
    grid = [r if r[:2] != (2, 0.4) else (2, 0.45, r[2]) for r in rows]
    short = [r for r in rows if r[1] < 0.25]  # 3 times per trajectory
    (tmp / "empty.csv").write_text("")
    (tmp / "garbage.parquet").write_bytes(b"not a parquet file at all")
    (tmp / "data.txt").write_text("trajectory,t,a\n0,0,1\n")
    np.savez(tmp / "no_x.npz", t=np.arange(5.0))
    return {
        "empty": (tmp / "empty.csv", "", "is empty"),
        "nan": (
            _csv(tmp / "nan.csv", nan),
            "",
            "non-finite value (nan) in trajectory 1 at t = 0.2",
        ),
        "inf": (
            _csv(tmp / "inf.csv", inf),
            "",
            "non-finite value (inf) in trajectory 2 at t = 0.3",
        ),
        "one trajectory": (
            _csv(tmp / "one.csv", [r for r in rows if r[0] == 0]),
            "",
            "holds 1 trajectory; the train/validation/test split needs at least 3",
        ),
        "too few times": (_csv(tmp / "short.csv", short), "", "has 3 time points"),
        "observed too long": (
            _csv(tmp / "obs.csv", rows),
            "n_observed = 6\n",
            "needs at least 7 (n_observed = 6)",
        ),
        "duplicate time": (_csv(tmp / "dup.csv", dup), "", "duplicate time t = 0.2 after t = 0.2"),
        "not increasing": (_csv(tmp / "back.csv", back), "", "time not increasing: t = 0.05"),
        "grids differ": (
            _csv(tmp / "grid.csv", grid),
            "",
            "trajectory 2 has a different time grid from trajectory 0 (t = 0.45 against 0.4",
        ),
        "missing column": (
            _csv(tmp / "miss.csv", rows),
            'state = ["a", "b"]\n',
            "missing column 'b'",
        ),
        "extra column": (
            _csv(tmp / "extra.csv", [(*r, 0) for r in rows], "trajectory,t,a,junk"),
            'state = ["a"]\n',
            "extra column 'junk'",
        ),
        "not numeric": (
            _csv(tmp / "text.csv", [r if r[:2] != (0, 0.1) else (0, 0.1, "x") for r in rows]),
            "",
            "column 'a' is not numeric ('x' in row 3)",
        ),
        "wrong format": (tmp / "garbage.parquet", "", "cannot be read as PARQUET"),
        "unknown suffix": (tmp / "data.txt", "", "unknown format '.txt'"),
        "npz without x": (tmp / "no_x.npz", "", "missing array 'x'"),
        "missing file": (tmp / "nowhere.csv", "", "does not exist"),
    }


def _store_is_empty(home: Path) -> bool:
    return not (home / "mlflow").exists() and not (home / "cache").exists()


SUBPROCESS_CASES = ("empty", "nan", "grids differ")


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_a_bad_file_is_one_line_and_exit_2_as_the_user_sees_it(tmp_path: Path, case: str) -> None:
    data, extra, problem = _bad_cases(tmp_path)[case]
    home = tmp_path / "home"
    env = {**os.environ, "NLLAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "benchmark",
            "--profile",
            "smoke",
            "--config",
            str(_config(tmp_path, data, extra)),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"data file {str(data)!r}: " in lines[0] and problem in lines[0]
    assert _store_is_empty(home)


@pytest.mark.parametrize(
    "case",
    [
        "inf",
        "one trajectory",
        "too few times",
        "observed too long",
        "duplicate time",
        "not increasing",
        "missing column",
        "extra column",
        "not numeric",
        "wrong format",
        "unknown suffix",
        "npz without x",
        "missing file",
    ],
)
def test_every_bad_file_case_is_named_with_exit_2_and_an_empty_store(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    data, extra, problem = _bad_cases(tmp_path)[case]
    home = tmp_path / "home"
    monkeypatch.setenv("NLLAB_HOME", str(home))
    cfg = _config(tmp_path, data, extra)
    assert main(["benchmark", "--profile", "smoke", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert f"data file {str(data)!r}: " in err and problem in err, err
    assert _store_is_empty(home)


def test_a_file_larger_than_memory_allows_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import datasets._declared as declared

    data = _csv(tmp_path / "big.csv", _good_rows())
    monkeypatch.setattr(declared, "available_memory", lambda: data.stat().st_size)
    read = []
    monkeypatch.setattr(declared, "_long_form", lambda *a: read.append(a))  # must not be reached
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    cfg = _config(tmp_path, data)
    assert main(["benchmark", "--profile", "smoke", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"data file {str(data)!r}: is " in err and "of memory and" in err, err
    assert read == []
    assert _store_is_empty(tmp_path / "home")
