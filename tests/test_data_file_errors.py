"""A bad data file is one line naming the file and its problem, exit code 2, and nothing in the
store: each case through ``nllab benchmark`` (a few as the user runs it, in a subprocess; the
rest through :func:`flows.cli.main` in this process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
    huge = [r if r[:2] != (2, 0.3) else (2, 0.3, 1e308) for r in rows]
    (zero := tmp / "zero.csv").symlink_to("/dev/zero")
    (urandom := tmp / "random.npz").symlink_to("/dev/urandom")
    (tmp / "folder.csv").mkdir()
    (tmp / "latin.csv").write_bytes(b"trajectory,t,\xe9\n0,0,1\n")
    (tmp / "long.csv").write_text("t" * 100_000 + "\n0\n")
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
        "wrong format": (tmp / "garbage.parquet", "", "is not a Parquet file"),
        "unknown suffix": (tmp / "data.txt", "", "unknown format '.txt'"),
        "npz without x": (tmp / "no_x.npz", "", "missing array 'x'"),
        "missing file": (tmp / "nowhere.csv", "", "does not exist"),
        "overflow": (
            _csv(tmp / "huge.csv", huge),
            "",
            "value 1e+308 in trajectory 2 at t = 0.3 (state dimension 0) is too large to normalise",
        ),
        "zero device": (zero, "", "is a character device (/dev/zero), not a data file"),
        "random device": (urandom, "", "is a character device (/dev/urandom), not a data file"),
        "folder": (tmp / "folder.csv", "", "is a folder, not a data file"),
        "not utf-8": (tmp / "latin.csv", "", "is not UTF-8 text (byte 13 cannot be decoded)"),
        "endless header": (tmp / "long.csv", "", "its first line is longer than 64 KiB"),
        "long column name": (
            _csv(tmp / "name.csv", [(*r, 0) for r in rows], "trajectory,t,a," + "j" * 5000),
            'state = ["a"]\n',
            "extra column 'jjjj",
        ),
    }


def _store_is_empty(home: Path) -> bool:
    return not (home / "mlflow").exists() and not (home / "cache").exists()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A scratch folder with a short path: a message quotes a data file's path whole only up to
    80 characters, and pytest's own folders are longer under xdist (``popen-gwN/``)."""
    folder = Path(tempfile.mkdtemp(prefix="nl-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


SUBPROCESS_CASES = ("empty", "nan", "grids differ")


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_a_bad_file_is_one_line_and_exit_2_as_the_user_sees_it(short_tmp: Path, case: str) -> None:
    data, extra, problem = _bad_cases(short_tmp)[case]
    home = short_tmp / "home"
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
            str(_config(short_tmp, data, extra)),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=short_tmp,
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
        "overflow",
        "zero device",
        "random device",
        "folder",
        "not utf-8",
        "endless header",
        "long column name",
    ],
)
def test_every_bad_file_case_is_named_with_exit_2_and_an_empty_store(
    short_tmp: Path, case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    data, extra, problem = _bad_cases(short_tmp)[case]
    home = short_tmp / "home"
    monkeypatch.setenv("NLLAB_HOME", str(home))
    cfg = _config(short_tmp, data, extra)
    assert main(["benchmark", "--profile", "smoke", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and len(err) < 400, err  # content quoted short, whatever it is
    assert f"data file {str(data)!r}: " in err and problem in err, err
    assert _store_is_empty(home)


def test_a_file_larger_than_memory_allows_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import datasets._datafile as datafile

    data = _csv(tmp_path / "big.csv", _good_rows())
    monkeypatch.setattr(datafile, "available_memory", lambda: data.stat().st_size)
    read = []
    monkeypatch.setattr(datafile, "_frames", lambda *a: read.append(a))  # must not be reached
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    cfg = _config(tmp_path, data)
    assert main(["benchmark", "--profile", "smoke", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"data file {str(data)!r}: is " in err and "of memory and" in err, err
    assert read == []
    assert _store_is_empty(tmp_path / "home")


def test_a_2_gb_sparse_file_is_refused_at_once_reading_64_kib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A file of NUL bytes (a sparse file, a disk image renamed .csv) is refused by its first
    bytes, whatever the memory: never parsed, never quoted."""
    import datasets._datafile as datafile

    data = tmp_path / "sparse.csv"
    with open(data, "wb") as fh:
        fh.truncate(2**31)  # 2 GiB, no block written
    monkeypatch.setattr(datafile, "available_memory", lambda: 2**45)  # as on a big machine
    monkeypatch.setattr(datafile, "_frames", lambda *a: pytest.fail("parsed"))
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    t0 = time.perf_counter()
    assert main(["benchmark", "--profile", "smoke", "--config", str(_config(tmp_path, data))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("is not a text file (a NUL byte at offset 0); a CSV file is text"), err
    assert "\n" not in err and len(err) < 300 and time.perf_counter() - t0 < 30


def test_refusing_a_bad_value_deep_in_a_csv_holds_under_twice_its_arrays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CSV is parsed in chunks, each converted to float64 at once: refusing its last row
    costs less than twice the arrays the file holds (a whole-file parse costs ~4.5 times)."""
    import tracemalloc

    import datasets._datafile as datafile
    from datasets._declared import DataFileError, read_trajectories

    n, steps = 2000, 100
    rows = np.column_stack(
        [np.repeat(np.arange(n), steps), np.tile(np.linspace(0, 1, steps), n)]
        + [np.random.default_rng(0).standard_normal(n * steps)] * 2
    )
    data = tmp_path / "deep.csv"
    with open(data, "w") as fh:
        fh.write("trajectory,t,a,b\n")
        np.savetxt(fh, rows, fmt=["%d", "%.6f", "%.6f", "%.6f"], delimiter=",")
        fh.write(f"{n - 1},2.0,oops,1\n")
    monkeypatch.setattr(datafile, "CSV_CHUNK_ROWS", 20_000)  # chunks as a big file has them
    read_trajectories(_csv(tmp_path / "warm.csv", _good_rows()))  # pandas' lazy imports
    tracemalloc.start()
    try:
        with pytest.raises(DataFileError, match=f"'oops' in row {n * steps + 2}"):
            read_trajectories(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    arrays = rows.size * 8  # what the file holds, as float64
    assert peak < 2 * arrays, peak / arrays
