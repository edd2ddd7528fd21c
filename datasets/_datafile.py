"""Reading a user's data file, bounded whatever the file holds.

A file is checked before it is parsed: a regular file (not a folder, ``/dev/zero`` or a pipe,
named through a symlink's target), a known format, not empty, small enough for the memory
available, and its first bytes what its format begins with (a CSV's header line is UTF-8 text,
Parquet starts and ends with ``PAR1``, NPZ is a zip archive). A CSV is then parsed in chunks,
each converted to float64 columns as it comes, so that the memory while reading (and while
refusing a value deep in the file) stays near the size of the arrays it yields. Every message
quotes file content cut to a short prefix (:func:`quote`).
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from datasets._simulate import available_memory

__all__ = [
    "CSV_CHUNK_ROWS",
    "FORMATS",
    "MEMORY_PER_FILE_BYTE",
    "QUOTE_CHARS",
    "SNIFF_BYTES",
    "DataFileError",
    "LongForm",
    "check_file",
    "fail",
    "quote",
    "read_long_form",
    "read_npz",
]

#: Data file suffixes understood.
FORMATS = (".csv", ".parquet", ".npz")
#: Bytes of memory per byte of file while a file is parsed into arrays and then trained on
#: (text and frame copies, then ``_simulate._ARRAY_COPIES`` arrays): checked before reading.
MEMORY_PER_FILE_BYTE = 8
#: Bytes of a data file read to check its format before it is parsed; characters of a file's
#: content (a column name, a value) a message quotes at most; rows of a CSV parsed at a time.
SNIFF_BYTES, QUOTE_CHARS, CSV_CHUNK_ROWS = 64 * 1024, 80, 1 << 16

#: ``(ids [N], t [N, T], x [N, T, D], state labels)`` as a reader returns them.
LongForm = tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]


class DataFileError(ValueError):
    """A data file that cannot be used: the message names the file and the problem."""


def quote(text: object, limit: int = QUOTE_CHARS) -> str:
    """``text`` as a message quotes it: at most ``limit`` characters, then how many it had (a
    message never carries a file's bytes wholesale, whatever the file holds)."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def fail(path: Path, problem: str) -> DataFileError:
    """The one line for ``problem`` with the data file at ``path``."""
    return DataFileError(f"data file {quote(str(path))!r}: {problem}")


def _names(names: Sequence[object], most: int = 8) -> str:
    """Column or array names as a message lists them: each cut short, at most ``most``."""
    shown = ", ".join(quote(n, 40) for n in names[:most])
    return shown + (f", … ({len(names)} in all)" if len(names) > most else "")


def _special(path: Path) -> str | None:
    """What ``path`` is when it is there but not a regular file (a folder, a device such as
    ``/dev/zero``, a pipe), with a symlink's target; ``None`` for a regular file or nothing."""
    try:
        mode = path.stat().st_mode  # follows symlinks
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    )
    kind = next((k for test, k in kinds if test(mode)), "a special file")
    target = f" ({quote(os.path.realpath(path))})" if path.is_symlink() else ""
    return f"is {kind}{target}, not a data file"


def check_file(path: Path) -> None:
    """Every check of ``path`` that needs no parsing (see the module's docstring), each a
    :class:`DataFileError` naming the file and its problem."""
    if (special := _special(path)) is not None:
        raise fail(path, special)
    if not path.is_file():
        raise fail(path, "does not exist")
    if path.suffix.lower() not in FORMATS:
        raise fail(path, f"unknown format {quote(path.suffix)!r}; valid: {', '.join(FORMATS)}")
    size = path.stat().st_size
    if size == 0:
        raise fail(path, "is empty")
    available = available_memory()
    if available is not None and size * MEMORY_PER_FILE_BYTE > available:
        gib = 2.0**30
        raise fail(
            path,
            f"is {size / gib:.2f} GiB; reading and training on it needs about "
            f"{size * MEMORY_PER_FILE_BYTE / gib:.1f} GiB of memory and "
            f"{available / gib:.1f} GiB is available",
        )
    _sniff(path, size)


def _sniff(path: Path, size: int) -> None:
    """Refuse a file whose first and last bytes are not what its format starts and ends with,
    before a parser reads it whole."""
    with open(path, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
        fh.seek(max(0, size - 4))
        tail = fh.read(4)
    suffix = path.suffix.lower()
    if suffix == ".parquet" and not (head.startswith(b"PAR1") and tail == b"PAR1"):
        raise fail(path, "is not a Parquet file (it does not start and end with 'PAR1')")
    if suffix == ".npz" and not head.startswith(b"PK"):
        raise fail(path, "is not an NPZ file (a zip archive starts with 'PK')")
    if suffix != ".csv":
        return
    if (nul := head.find(b"\0")) >= 0:
        raise fail(path, f"is not a text file (a NUL byte at offset {nul}); a CSV file is text")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) == size)
    except UnicodeDecodeError as e:
        raise fail(path, f"is not UTF-8 text (byte {e.start} cannot be decoded)") from None
    if b"\n" not in head and b"\r" not in head and size > len(head):
        raise fail(path, f"its first line is longer than {SNIFF_BYTES // 1024} KiB: not a header")


def _unreadable(path: Path, err: Exception) -> DataFileError:
    kind = path.suffix.lower().lstrip(".").upper()
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return fail(path, f"cannot be read as {kind} ({quote(first)})")


def _frames(path: Path) -> Iterator:
    """The table of ``path`` as pandas frames: a CSV in chunks of :data:`CSV_CHUNK_ROWS` rows,
    a Parquet file whole (binary and compact: its arrays are its size)."""
    import pandas as pd

    try:
        if path.suffix.lower() != ".csv":
            yield pd.read_parquet(path)
            return
        with pd.read_csv(path, chunksize=CSV_CHUNK_ROWS, low_memory=False) as chunks:
            yield from chunks
    except DataFileError:
        raise
    except Exception as err:  # the readers raise many kinds; each is "cannot be read"
        raise _unreadable(path, err) from None


def _columns(
    path: Path, frame, trajectory: str, time: str, state: Sequence[str] | None
) -> tuple[str, ...]:
    """The state columns of the table whose first frame is ``frame``, its columns checked."""
    columns = [str(c) for c in frame.columns]
    for needed in (trajectory, time, *(state or ())):
        if needed not in columns:
            raise fail(path, f"missing column {quote(needed, 40)!r} (columns: {_names(columns)})")
    if state is None:
        state = tuple(c for c in columns if c not in (trajectory, time))
        if not state:
            raise fail(path, f"no state column besides {trajectory!r} and {time!r}")
    extra = [c for c in columns if c not in (trajectory, time, *state)]
    if extra:
        raise fail(
            path,
            f"extra column {quote(extra[0], 40)!r} (not {trajectory!r}, {time!r} or a state "
            "column)",
        )
    return tuple(state)


def _numeric(path: Path, column, name: str, first_row: int) -> np.ndarray:
    """``column`` (a frame's, its first row the file's row ``first_row``) as float64."""
    import pandas as pd

    v = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(v) & column.notna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        value = quote(repr(column.iloc[row]))
        raise fail(path, f"column {name!r} is not numeric ({value} in row {first_row + row})")
    return v


def _codes(path: Path, column, name: str, ids: dict) -> np.ndarray:
    """Trajectory codes of ``column``, numbered over the whole file in order of appearance
    (``ids``: value → code so far, extended here)."""
    import pandas as pd

    codes, uniques = pd.factorize(column, sort=False)
    if (codes < 0).any():
        raise fail(path, f"column {name!r} has an empty value")
    lookup = np.array([ids.setdefault(u, len(ids)) for u in uniques.tolist()], dtype=np.int64)
    return lookup[codes]


def read_long_form(path: Path, trajectory: str, time: str, state: Sequence[str] | None) -> LongForm:
    """(ids [N], t [N, T'], x [N, T', D], state labels) from a long-form table; ``T'`` equal
    per trajectory."""
    ids: dict = {}
    codes: list[np.ndarray] = []
    values: dict[str, list[np.ndarray]] = {}
    rows = 0
    for frame in _frames(path):
        if not values:
            state = _columns(path, frame, trajectory, time, state)
            values = {c: [] for c in (time, *state)}
        for c, parts in values.items():
            parts.append(_numeric(path, frame[c], c, rows + 2))  # row 1 is the header
        codes.append(_codes(path, frame[trajectory], trajectory, ids))
        rows += len(frame)
    if rows == 0:
        raise fail(path, "is empty (no rows)")
    assert state is not None
    code = np.concatenate(codes)
    counts = np.bincount(code)
    if (counts != counts[0]).any():
        k = int(np.argmax(counts != counts[0]))
        names = list(ids)
        first, other = names[0], names[k]
        raise fail(
            path,
            f"trajectory {quote(repr(other))} has {counts[k]} time points and trajectory "
            f"{quote(repr(first))} {counts[0]}: the time grid must be the same for every "
            "trajectory",
        )
    order = np.argsort(code, kind="stable")  # file order within each trajectory
    n, steps = len(ids), int(counts[0])
    t = np.concatenate(values.pop(time))[order].reshape(n, steps)
    x = np.empty((n, steps, len(state)))
    for d, c in enumerate(state):
        x[..., d] = np.concatenate(values.pop(c))[order].reshape(n, steps)
    return np.asarray(list(ids)), t, x, tuple(state)


def read_npz(path: Path) -> LongForm:
    """(ids [N], t [N, T], x [N, T, D], labels) from an NPZ file of ``t [T]`` and ``x``."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except Exception as err:
        raise fail(path, f"cannot be read as NPZ ({type(err).__name__}: {quote(err)})") from None
    for key in ("t", "x"):
        if key not in arrays:
            raise fail(path, f"missing array {key!r} (arrays: {_names(list(arrays)) or 'none'})")
    extra = sorted(set(arrays) - {"t", "x"})
    if extra:
        raise fail(
            path, f"extra array {quote(extra[0], 40)!r} (expected only 't' [T] and 'x' [N, T, D])"
        )
    t, x = arrays["t"], arrays["x"]
    if t.ndim != 1 or x.ndim != 3 or x.shape[1] != t.shape[0]:
        raise fail(path, f"expected t [T] and x [N, T, D], got t {t.shape} and x {x.shape}")
    if x.size == 0:
        raise fail(path, "is empty (no values in x)")
    try:
        t, x = t.astype(np.float64), x.astype(np.float64)
    except (TypeError, ValueError):
        raise fail(path, f"t and x must be numeric, got {t.dtype} and {x.dtype}") from None
    n = x.shape[0]
    return (
        np.arange(n),
        np.broadcast_to(t, (n, t.size)),
        x,
        tuple(f"x{i}" for i in range(x.shape[2])),
    )
