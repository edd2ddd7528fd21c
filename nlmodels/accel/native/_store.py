"""Where the kernel library is built and kept, and what makes it trusted enough to load.

Loading a shared object runs its code (its constructors run at ``dlopen``), so the loader only
loads a library that this user built and that nobody else could have replaced:

* the cache directory (``$NLLAB_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/nllab/native`` or
  ``~/.cache/nllab/native``) must be owned by this user and writable by nobody else; one that is
  not, or that this process cannot write (a read-only cache), is refused with a warning, and the
  next choice is used: the default directory, the home's (``$NLLAB_HOME/native``), else a
  private temporary one;
* each build records the library's SHA-256 and its self-test result in a sidecar file
  (``<library>.json``, written atomically); a library is loaded only when its bytes match the
  recorded hash and the file is the user's own and writable by nobody else;
* a library that fails that check, or fails to load, or fails its self-test, is rebuilt once;
* the first self-test of a build runs in a child process (``_selftest.py``), so a library that
  cannot run on this CPU kills the child, not the caller, and the caller falls back;
* building and checking hold a lock file, so processes sharing a cache build once.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nlmodels._cpu import PORTABLE_MARCH, cpu_features, portable
from nlmodels.accel.native._selftest import self_test

SOURCE = Path(__file__).with_name("kernels.c")
#: The self-test run in a child process for a new build (a script: it imports neither torch nor
#: this package, so the child starts in a few tens of milliseconds).
SELF_TEST_SCRIPT = Path(__file__).with_name("_selftest.py")
_FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11")
# Native mode: 512-bit vectors where the CPU has them (GCC otherwise caps auto-vectorisation at
# 256 bits). Portable mode: no FMA contraction, so every operation rounds as the C source says
# and the bytes do not depend on the compiler's choice of fused operations (no -ffast-math in
# either mode: reductions keep the source's order).
_NATIVE_FLAGS = ("-mprefer-vector-width=512",)
_PORTABLE_FLAGS = ("-ffp-contract=off",)
_PASSED = "passed"

_private_dir: Path | None = None
_private_lock = threading.Lock()


def flags() -> tuple[str, ...]:
    """Compiler flags of the CPU numerics mode (:mod:`nlmodels.numerics`): portable
    ``-march=x86-64-v3 -ffp-contract=off``, native ``-march=native``;
    ``$NLLAB_NATIVE_MARCH`` overrides the target CPU, e.g. ``haswell`` for the AVX2 + FMA build
    on any newer CPU (the tests run both builds)."""
    own = _PORTABLE_FLAGS if portable() else _NATIVE_FLAGS
    march = os.environ.get("NLLAB_NATIVE_MARCH") or (PORTABLE_MARCH if portable() else "native")
    return (f"-march={march}", *_FLAGS, *own)


def _default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nllab" / "native"


def unsafe_reason(path: Path) -> str | None:
    """Why others could write ``path`` (a file or directory), or None when only this user can."""
    info = path.stat()
    if info.st_uid != os.getuid():
        return f"owned by user id {info.st_uid}, not by you ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _home_dir() -> Path:
    """``native`` in the platform's home (``$NLLAB_HOME``, else ``~/.nllab``, as
    ``datasets.data_home``): the cache of a process whose cache folders cannot be written."""
    home = os.environ.get("NLLAB_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".nllab") / "native"


def _usable_dir(path: Path) -> str | None:
    """Create ``path`` (private) if missing; None when it is safe to build and load in, and
    this process can write there."""
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass  # a concurrent process made it: checked below like any existing directory
        except OSError as error:
            return f"cannot be created ({error.strerror})"
    if not path.is_dir():
        return "not a directory"
    if (reason := unsafe_reason(path)) is not None:
        return f"{reason}: another user could plant a library there"
    try:
        tempfile.TemporaryFile(dir=path).close()
    except OSError as error:
        return f"not writable ({error.strerror or error})"
    return None


def cache_dir() -> Path:
    """The first safe and writable cache directory: the configured one, the default one, the
    home's, or a private temporary one (built afresh by each process)."""
    global _private_dir
    configured = os.environ.get("NLLAB_NATIVE_CACHE")
    candidates = [Path(configured).expanduser()] if configured else []
    candidates += [_default_dir(), _home_dir()]
    refused = []
    for candidate in dict.fromkeys(candidates):
        reason = _usable_dir(candidate)
        if reason is None:
            chosen = candidate
            break
        refused.append(f"{candidate} is {reason}")
    else:
        with _private_lock:
            if _private_dir is None:
                _private_dir = Path(tempfile.mkdtemp(prefix="nllab-native-"))
                atexit.register(_remove_private_dir, _private_dir, os.getpid())
            chosen = _private_dir
    if refused:
        warnings.warn(
            "nlmodels: not using the native kernel cache "
            + "; ".join(refused)
            + f"; building in {chosen} instead. "
            "Point NLLAB_NATIVE_CACHE to a directory only you can write (chmod 700).",
            RuntimeWarning,
            stacklevel=4,
        )
    return chosen


def _remove_private_dir(folder: Path, maker: int) -> None:
    """Remove the private cache ``folder`` at the exit of the process that made it (a forked
    child leaves it to its parent, which may still load from it)."""
    if os.getpid() == maker:
        shutil.rmtree(folder, ignore_errors=True)


def target(directory: Path) -> Path:
    """Where this source, these flags and this CPU's build lives in ``directory`` (no compiler is
    needed to find it: plain C has a stable ABI, so a build by any C compiler serves)."""
    parts = (SOURCE.read_bytes(), " ".join(flags()), platform.machine(), cpu_features())
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return directory / f"nlkernels-{digest.hexdigest()[:16]}.so"


def _record_path(library: Path) -> Path:
    return library.with_suffix(".json")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_record(library: Path, sha256: str, self_test_result: str) -> None:
    record = {"sha256": sha256, "self_test": self_test_result}
    _write_atomic(_record_path(library), json.dumps(record).encode())


def _read_record(library: Path) -> dict[str, str]:
    try:
        record = json.loads(_record_path(library).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def verification_problem(library: Path) -> str | None:
    """Why ``library`` must not be loaded as it is, or None when it is the recorded build."""
    if not library.exists():
        return "not built yet"
    record_path = _record_path(library)
    if not record_path.exists():
        return "it has no build record (not built by this loader)"
    for path in (library, record_path):
        reason = unsafe_reason(path)
        if reason is not None:
            return f"{path.name} is {reason}"
    if _read_record(library).get("sha256") != _sha256(library):
        return "its bytes do not match the SHA-256 recorded at its build (corrupted or replaced)"
    return None


def build(library: Path) -> None:
    """Compile the kernels to ``library`` (atomically) and record its hash, self-test pending."""
    compiler = os.environ.get("CC") or "cc"
    _compile("C", [compiler, *flags(), str(SOURCE)], ["-lmvec", "-lm"], library)


def _compile(language: str, command: list[str], libraries: list[str], library: Path) -> None:
    """Run the ``language`` compiler ``command`` (its output and ``libraries`` appended) into
    ``library`` atomically, and record the result's hash, self-test pending."""
    if shutil.which(command[0]) is None:
        raise OSError(f"no {language} compiler {command[0]!r} on PATH")
    fd, tmp = tempfile.mkstemp(prefix=f"{library.name}.", suffix=".tmp", dir=library.parent)
    os.close(fd)
    try:
        result = _patiently([*command, "-o", tmp, *libraries], BUILD_TIMEOUTS)
        if result.returncode != 0:
            raise OSError(f"{command[0]} failed: {result.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o700)
        sha256 = _sha256(Path(tmp))
        os.replace(tmp, library)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _write_record(library, sha256, "pending")


#: Seconds a build (and a self-test) may take; on a busy machine a first try that times out is
#: retried once with the longer limit before the kernels are given up.
BUILD_TIMEOUTS = (300.0, 900.0)
SELF_TEST_TIMEOUTS = (120.0, 360.0)


def _patiently(command: list[str], timeouts: tuple[float, ...]) -> subprocess.CompletedProcess:
    """``command``'s run, retried with the next limit when it times out (the last timeout
    raises ``subprocess.TimeoutExpired``)."""
    for i, limit in enumerate(timeouts):
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            if i == len(timeouts) - 1:
                raise
    raise ValueError("no timeouts given")


def child_self_test(library: Path) -> str | None:
    """Run the self-test of ``library`` in a child process: None when it passed, else why not."""
    try:
        result = _patiently(
            [sys.executable, "-I", str(SELF_TEST_SCRIPT), str(library)], SELF_TEST_TIMEOUTS
        )
    except subprocess.TimeoutExpired:
        return f"the self-test did not finish in {SELF_TEST_TIMEOUTS[-1]:.0f} s"
    if result.returncode < 0:
        try:
            name = signal.Signals(-result.returncode).name
        except ValueError:
            name = f"signal {-result.returncode}"
        return f"the self-test process was killed by {name}"
    if result.returncode != 0:
        return f"the self-test failed: {result.stderr.strip()[-500:]}"
    return None


@contextmanager
def _locked(library: Path) -> Iterator[None]:
    fd = os.open(library.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _tested(library: Path, built: bool) -> bool:
    """Whether ``library`` (verified) has passed its self-test, running it in a child if not
    yet; a failing old build is rebuilt and tested once more. Returns whether it was rebuilt."""
    if _read_record(library).get("self_test") == _PASSED:
        return built
    failure = child_self_test(library)
    if failure is not None and not built:
        build(library)
        built = True
        failure = child_self_test(library)
    if failure is not None:
        raise OSError(f"{failure} (library {library})")
    _write_record(library, _sha256(library), _PASSED)
    return built


def load_trusted() -> ctypes.CDLL:
    """Build if needed, verify and load the kernel library; OSError when that cannot be done."""
    library = target(cache_dir())
    with _locked(library):
        problem = verification_problem(library)
        built = problem is not None
        if built:
            if library.exists():
                warnings.warn(
                    f"nlmodels: not loading the cached native kernels {library}: {problem}; "
                    "rebuilding them.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            build(library)
        built = _tested(library, built)
        try:
            loaded = ctypes.CDLL(str(library))
        except OSError:
            if built:
                raise
            build(library)
            _tested(library, True)
            loaded = ctypes.CDLL(str(library))
        failure = self_test(loaded)
        if failure is not None:
            # dlopen keeps this file mapped under its name: the next process rebuilds it
            _write_record(library, _sha256(library), "failed")
            raise OSError(f"the native kernels' self-test failed: {failure}")
    return loaded


# -- the operators' C++ registration (dispatch.cpp) ---------------------------------------------
DISPATCH_SOURCE = Path(__file__).with_name("dispatch.cpp")


def _torch_build() -> tuple[list[str], list[str], str]:
    """Compiler flags, linker arguments and version of the torch this process imports (a C++
    library registered with torch's dispatcher must match its headers and ABI)."""
    import torch
    from torch.utils.cpp_extension import include_paths

    lib = str(Path(torch.__file__).parent / "lib")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = ["-O2", "-std=c++17", "-fPIC", "-shared", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    flags += [f"-I{path}" for path in include_paths()]
    return flags, [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu"], torch.__version__


def dispatch_target(directory: Path) -> Path:
    """Where this source's registration library for this torch lives in ``directory``."""
    compile_flags, link, version = _torch_build()
    digest = hashlib.sha256()
    for part in (DISPATCH_SOURCE.read_bytes(), " ".join(compile_flags + link), version):
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return directory / f"nldispatch-{digest.hexdigest()[:16]}.so"


def mark_passed(library: Path) -> None:
    """Record that ``library`` (verified) passed its check (done by its caller, in process)."""
    _write_record(library, _sha256(library), _PASSED)


def load_dispatch() -> tuple[ctypes.CDLL, Path, bool]:
    """Build if needed, verify and load the registration library (``$CXX``, else ``c++``):
    the library, its path and whether it has passed its check before (else the caller checks
    the operators it registers and calls :func:`mark_passed`). OSError when it cannot be had.
    It holds no maths of its own (it calls the kernel library), so no child self-test."""
    library = dispatch_target(cache_dir())
    with _locked(library):
        problem = verification_problem(library)
        if problem is not None:
            if library.exists():
                warnings.warn(
                    f"nlmodels: not loading the cached operator registration {library}: "
                    f"{problem}; rebuilding it.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            compile_flags, link, _ = _torch_build()
            compiler = os.environ.get("CXX") or "c++"
            _compile("C++", [compiler, *compile_flags, str(DISPATCH_SOURCE)], link, library)
        loaded = ctypes.CDLL(str(library))
        return loaded, library, _read_record(library).get("self_test") == _PASSED
