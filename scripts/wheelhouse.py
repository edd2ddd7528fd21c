"""Write a folder of wheels that installs Neural Laplace Lab without internet over a CUDA torch.

GPU nodes of clusters are often air-gapped: build the folder where PyPI is reachable, copy it
over, then on the GPU node (torch with CUDA already installed)::

    pip install --no-index --find-links wheelhouse neural-laplace-lab

Every dependency of ``pyproject.toml`` is downloaded as a binary wheel for the target interpreter
and platform (default CPython 3.12, manylinux x86-64) with its own dependencies, except torch,
which the node already has (its CUDA build must not be replaced): ``torchdiffeq`` and
``torchlaplace`` come without their dependencies, and nothing named ``torch``, ``triton`` or
``nvidia-*`` enters the folder. ``make wheelhouse`` adds the ``reference`` extra (the reference
package ``torchlaplace``, which ``make gpu-check`` times Neural Laplace beside).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Installed with torch on the GPU node; never downloaded.
EXCLUDED = re.compile(r"^(torch|triton|nvidia[-_].*|cuda[-_].*)$", re.IGNORECASE)
#: Need torch (and what the project needs anyway: scipy): downloaded without their dependencies.
TORCH_ONLY = ("torchdiffeq", "torchlaplace")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip()


def requirements(extras: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(with dependencies, without) requirement strings of the project, torch left out."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    full = [r for r in reqs if not EXCLUDED.match(_name(r)) and _name(r) not in TORCH_ONLY]
    bare = [r for r in reqs if _name(r) in TORCH_ONLY]
    return full, bare


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _platform_args(python: str, platforms: list[str]) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for p in platforms:
        args += ["--platform", p]
    return args


def build(
    out: Path,
    python: str,
    platforms: list[str],
    extras: tuple[str, ...],
    exclude: tuple[str, ...] = (),
) -> list[Path]:
    """Download the wheels into ``out``; ``exclude`` drops wheels the target already has."""
    out.mkdir(parents=True, exist_ok=True)
    full, bare = requirements(extras)
    pip = [sys.executable, "-m", "pip"]
    target = _platform_args(python, platforms)
    subprocess.run([*pip, "download", "--dest", str(out), *target, *full], check=True)
    if bare:
        subprocess.run(
            [*pip, "download", "--no-deps", "--dest", str(out), *target, *bare], check=True
        )
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(out), str(ROOT)], check=True)
    dropped = {_canonical(n) for n in exclude}
    for w in out.glob("*.whl"):
        if _canonical(w.name.split("-")[0]) in dropped:
            w.unlink()
    wheels = sorted(out.glob("*.whl"))
    leaked = [w.name for w in wheels if EXCLUDED.match(w.name.split("-")[0])]
    if leaked:
        raise SystemExit(f"torch or CUDA wheels entered the wheelhouse: {', '.join(leaked)}")
    return wheels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=ROOT / "wheelhouse", help="folder (default: ./wheelhouse)"
    )
    p.add_argument("--python", default="3.12", help="target Python version (default 3.12)")
    p.add_argument(
        "--platform",
        action="append",
        dest="platforms",
        help="target platform tags (default: manylinux x86-64 and pure Python)",
    )
    p.add_argument(
        "--extra", action="append", default=[], help="also an optional extra, e.g. cluster"
    )
    p.add_argument(
        "--exclude",
        nargs="+",
        default=[],
        metavar="NAME",
        help="leave out wheels the target already has (e.g. numpy scipy pandas matplotlib); "
        "install those targets with --no-deps",
    )
    args = p.parse_args(argv)
    platforms = args.platforms or [
        "manylinux_2_28_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "any",
    ]
    wheels = build(args.out, args.python, platforms, tuple(args.extra), tuple(args.exclude))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB in {args.out}")
    print(
        "install (torch already there): "
        f"pip install --no-index --find-links {args.out} neural-laplace-lab"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
