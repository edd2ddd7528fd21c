"""The packages' lazy faces (PEP 562), made by :func:`nlmodels.lazy.lazy_face`."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from nlmodels.lazy import lazy_face


@pytest.fixture
def package(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A throwaway package ``fakepkg.room`` with a module ``fakepkg.room.inner``."""
    inner = types.ModuleType("fakepkg.room.inner")
    inner.answer = 42  # type: ignore[attr-defined]
    inner.real_name = "aliased"  # type: ignore[attr-defined]
    face = types.ModuleType("fakepkg.room")
    for name, module in {"fakepkg.room": face, "fakepkg.room.inner": inner}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return face


def test_a_name_loads_from_its_module_once_and_stays(package: types.ModuleType) -> None:
    where = {"answer": "inner", "alias": "fakepkg.room.inner"}
    package.__getattr__, package.__dir__ = lazy_face("fakepkg.room", where, {"alias": "real_name"})
    assert "answer" not in vars(package)
    assert package.answer == 42  # relative to the package
    assert vars(package)["answer"] == 42  # kept: the second use is a plain attribute
    assert package.alias == "aliased"  # by full name, under another name
    assert {"answer", "alias"} <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error_naming_it(package: types.ModuleType) -> None:
    package.__getattr__, _ = lazy_face("fakepkg.room", {"answer": "inner"})
    with pytest.raises(AttributeError, match=r"'fakepkg\.room' has no attribute 'nope'"):
        package.nope  # noqa: B018
    assert not hasattr(package, "nope")


def test_importing_the_faces_loads_no_library() -> None:
    """Every face is lazy: importing them all loads neither torch, mlflow nor prefect."""
    faces = "nlmodels nltrain nltrain.numerics tasks tasks.ledger tasks.tracking flows.ledger"
    code = (
        f"import sys, {', '.join(faces.split())}\n"
        "print(sorted(m for m in ('torch', 'mlflow', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
