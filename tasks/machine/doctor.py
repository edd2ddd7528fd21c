"""What ``nllab doctor`` checks on a machine, as typed findings (``flows/cli/doctor.py`` prints
them), after the convention of ``brew doctor`` and ``flutter doctor``: the CPU numerics in effect
and what they pin, the BLAS and maths libraries loaded and the kernels they chose, the native
kernels' build, CUDA devices, every module of the project importable (a dependency missing
from the environment named), the stores, and this machine's bytes against the pinned ones
(:data:`nltrain.numerics.PINNED`), each difference named by the component that computes it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import platform
import sqlite3
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "Finding",
    "Status",
    "check_installation",
    "diagnose",
    "failed",
    "problem_lines",
    "project_packages",
]

Status = Literal["ok", "info", "warn", "fail"]


@dataclass(frozen=True)
class Finding:
    """One line of the report: its section, what was looked at, what was found, and whether
    that is as it should be (``fail`` makes the command exit 1)."""

    section: str
    label: str
    value: str
    status: Status = "info"
    #: what explains this failure, when it explains others too (said once, with its checks)
    cause: str = ""


def failed(findings: list[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)


def problem_lines(findings: list[Finding]) -> list[str]:
    """One line per problem: a failure with a :attr:`Finding.cause` grouped with every other
    failure it explains (``cause: label, label (N checks)``), in first-seen order; any other
    failure as ``label: value``."""
    lines: list[str] = []
    by_cause: dict[str, list[str]] = {}
    for f in findings:
        if f.status != "fail":
            continue
        if not f.cause:
            lines.append(f"{f.label}: {f.value}")
        elif f.cause not in by_cause:
            by_cause[f.cause] = [f.label]
            lines.append(f.cause)  # its checks are filled in below
        else:
            by_cause[f.cause].append(f.label)
    for cause, labels in by_cause.items():
        checks = f" ({len(labels)} checks)" if len(labels) > 1 else ""
        lines[lines.index(cause)] = f"{cause}: {', '.join(labels)}{checks}"
    return lines


def diagnose(*, fresh: bool = False) -> list[Finding]:
    """Every finding, in the order the report prints them; ``fresh`` recomputes the pinned
    bytes instead of reading this machine's earlier check of today's code."""
    import nlmodels

    setup = nlmodels.require_numerics()
    return [
        *_numerics(setup),
        *_libraries(),
        *_native(setup),
        *_cuda(),
        *check_installation(),
        *_stores(),
        *_pinned(setup, fresh),
    ]


def _numerics(setup) -> Iterator[Finding]:
    from nlmodels.numerics import cpu_features

    section = "CPU numerics"
    flags = set(cpu_features().split())
    wanted = ("avx2", "fma", "avx512f")
    yield Finding(section, "CPU", f"{_cpu_name()} ({', '.join(f for f in wanted if f in flags)})")
    yield _mode(section, setup)
    yield Finding(section, "torch kernels", setup.capability, "info")
    kernels = (
        "the platform's own (nlmodels.accel.portable)"
        if setup.kernels == "portable"
        else "torch's (MKL: bytes differ between CPU vendors)"
    )
    yield Finding(section, "products and functions", kernels, "info")
    names = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
    pinned = [f"{k}={os.environ[k]}" for k in names if os.environ.get(k)]
    yield Finding(section, "pinned", ", ".join(pinned) or "nothing")
    if setup.replaced:
        yield Finding(section, "replaced", ", ".join(setup.replaced), "warn")


def _mode(section: str, setup) -> Finding:
    """The mode in effect: as pinned (portable), as asked but not the pinned one (native: a
    warning, since the bytes checked below will differ), or not as asked (a failure)."""
    reason = f" — {setup.reason}" if setup.reason else ""
    value = f"{setup.mode} (asked: {setup.asked}){reason}"
    if setup.mode != setup.asked:
        fix = f"; fix: {setup.fix}" if setup.fix else ""
        return Finding(section, "mode", value + fix, "fail")
    if setup.mode != "portable":
        note = " — bit for bit on this machine only: the pins below are the portable mode's"
        return Finding(section, "mode", value + note, "warn")
    return Finding(section, "mode", value, "ok")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _libraries() -> Iterator[Finding]:
    import numpy  # noqa: F401  (each library loads its BLAS, which threadpoolctl then sees)
    import scipy.linalg  # noqa: F401
    import torch

    section = "BLAS and maths libraries"
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        yield Finding(section, "threadpoolctl", "not installed: libraries not listed", "warn")
        return
    for lib in threadpool_info():
        if lib.get("user_api") != "blas":
            continue
        name = Path(lib.get("filepath", "")).name
        kernels = lib.get("architecture") or lib.get("threading_layer") or "?"
        where = "numpy" if "numpy" in lib.get("filepath", "") else "scipy"
        yield Finding(
            section,
            f"{where}: {lib.get('internal_api')} {lib.get('version')}",
            f"kernels {kernels} ({name}); the data sets call no BLAS",
        )
    blas = next(
        (
            part.split("=", 1)[1]
            for part in torch.__config__.show().split(", ")
            if "BLAS_INFO=" in part
        ),
        "?",
    )
    yield Finding(section, f"torch {torch.__version__}", f"BLAS {blas}")
    yield Finding(section, "C library", " ".join(platform.libc_ver()))


def _native(setup) -> Iterator[Finding]:
    from nlmodels.accel.native import build_info

    section = "native kernels"
    build = build_info()
    needed = setup.asked == "portable"
    state: Status = "ok" if build.loaded else ("fail" if needed else "warn")
    value = "built and loaded" if build.loaded else f"unavailable: {(build.failure or '?')[:200]}"
    yield Finding(section, "library", f"{value} ({build.library})", state)
    yield Finding(section, "target", " ".join(build.flags))
    if not build.enabled_for_neural_laplace:
        yield Finding(section, "Neural Laplace", "its torch twins (NLLAB_NATIVE=0)", "info")


def _cuda() -> Iterator[Finding]:
    import torch

    if not torch.cuda.is_available():
        yield Finding("CUDA", "devices", f"none (torch {torch.__version__}: CPU build or no GPU)")
        return
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        memory = props.total_memory / 2**30
        yield Finding("CUDA", f"cuda:{i}", f"{props.name}, {memory:.0f} GiB", "ok")


def project_packages() -> tuple[str, ...]:
    """The top-level packages this installation of the project provides (its metadata's
    ``top_level.txt``; the five floors where it has none, as in a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution("neural-laplace-lab").read_text("top_level.txt") or ""
    except PackageNotFoundError:
        text = ""
    found = tuple(sorted(n for n in text.split() if not n.startswith("_")))
    return found or ("datasets", "flows", "nlmodels", "nltrain", "tasks")


def check_installation(packages: Iterable[str] | None = None) -> Iterator[Finding]:
    """Import every module of ``packages`` (default: :func:`project_packages`) except command
    entry points (``__main__``): a dependency left out of the environment (a wheelhouse that
    excluded one the machine lacks, a partial install) is named here, not at a run's first
    import of the module that needs it."""
    section = "installation"
    missing: dict[str, list[str]] = {}
    broken: dict[str, str] = {}
    imported = 0

    def note(name: str, error: BaseException) -> None:
        if isinstance(error, ModuleNotFoundError) and error.name:
            missing.setdefault(error.name.split(".")[0], []).append(name)
        else:
            broken[name] = f"{type(error).__name__}: {error}"

    for package in packages or project_packages():
        try:
            root = importlib.import_module(package)
        except Exception as error:
            note(package, error)
            continue
        imported += 1
        for info in pkgutil.walk_packages(root.__path__, f"{package}.", onerror=lambda _: None):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            try:
                importlib.import_module(info.name)
                imported += 1
            except Exception as error:
                note(info.name, error)
    for name, needers in sorted(missing.items()):
        shown = ", ".join(needers[:3]) + (
            f" and {len(needers) - 3} more" if len(needers) > 3 else ""
        )
        yield Finding(section, name, f"not installed: needed by {shown}", "fail")
    for name, problem in sorted(broken.items()):
        yield Finding(section, name, f"does not import: {problem[:200]}", "fail")
    if not missing and not broken:
        yield Finding(section, "modules", f"{imported} imported", "ok")


def _stores() -> Iterator[Finding]:
    from datasets import data_home
    from tasks.tracking.locations import store_path, tracking_uri

    section = "stores"
    home = data_home()
    yield Finding(section, "home", f"{home}: {_writable(home)}", _status(_writable(home)))
    if home.is_dir() and (mode := stat.S_IMODE(home.stat().st_mode)) & 0o077:
        value = f"others can read its stores and logs (mode {mode:o}): chmod 700 {home}"
        yield Finding(section, "home's mode", value, "warn")
    uri = tracking_uri()
    path = store_path(uri)
    if path is None:
        yield Finding(section, "MLflow", f"{uri} (a server or database: not checked here)")
    else:
        health = _sqlite_health(path)
        yield Finding(section, "MLflow store", f"{path}: {health}", _status(health))
    prefect = Path(os.environ.get("PREFECT_HOME") or home / "prefect").expanduser()
    yield Finding(section, "Prefect home", f"{prefect}: {_writable(prefect)}", "info")


def _status(health: str) -> Status:
    return "ok" if health.startswith(("writable", "healthy", "not created")) else "fail"


def _writable(folder: Path) -> str:
    if not folder.exists():
        return "not created yet (made on first use)"
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        return f"not writable ({e.strerror or e})"
    return "writable"


def _sqlite_health(path: Path) -> str:
    if not path.exists():
        return "not created yet (made by the first run)"
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            answer = db.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.Error as e:
        return f"unreadable ({e})"
    size = path.stat().st_size / 2**20
    return f"healthy ({size:.1f} MiB)" if answer == "ok" else f"damaged ({answer})"


def _pinned(setup, fresh: bool) -> Iterator[Finding]:
    from nltrain.numerics import PINNED, PINNED_WITH, check_pinned

    section = "bytes against the pins"
    check, computed = check_pinned(fresh=fresh)
    differing = {(m.kind, m.name): m for m in check.mismatches}
    for kind in ("data", "training"):
        for name in PINNED[kind]:
            m = differing.get((kind, name))
            if m is None:
                yield Finding(section, f"{kind} of {name}", "as pinned", "ok")
            else:
                value = f"differs ({m.got}, pinned {m.pinned})"
                cause = _cause(kind, setup)
                yield Finding(section, f"{kind} of {name}", value, "fail", cause)
    how = "computed now" if computed else "this machine's earlier check of today's code"
    yield Finding(section, "checked", f"{how}; pinned with {PINNED_WITH}")
    yield Finding(section, "runs tagged", f"numerics.pinned = {check.verdict}")


def _cause(kind: str, setup) -> str:
    """The component that computes other bytes, as far as this process can tell."""
    import numpy
    import torch

    if kind == "data":
        return (
            f"numpy {numpy.__version__} or the C library ({' '.join(platform.libc_ver())}) "
            "computes other bytes"
        )
    if setup.mode != "portable":
        return (
            f"the {setup.mode} CPU numerics (torch's {setup.capability} kernels and MKL) compute "
            "other bytes than the portable mode's pins (NLLAB_CPU_NUMERICS=portable checks them)"
        )
    return f"torch {torch.__version__} or glibc {platform.libc_ver()[1]} computes other bytes"
