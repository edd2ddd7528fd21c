"""The shape of the code, read from its import statements (every one, function-level and
``if TYPE_CHECKING:`` ones included): the floors ``nlmodels``/``datasets`` → ``nltrain`` →
``tasks`` → ``flows`` only import downwards; within them, each room (a subpackage with one face,
its ``__init__``) imports only the rooms :data:`ROOM_MAY_IMPORT` names, and those imports form
no circle; no module imports itself back through others; ``tasks`` and ``flows`` keep at most
15 modules at their top, each face names at most 30, and no module outgrows a reader (500
lines)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nlmodels", "datasets", "nltrain", "tasks", "flows")
MAX_LINES = 500
#: Which of the project's packages, and which orchestration libraries, each floor may import.
FLOOR_MAY_IMPORT = {
    "nlmodels": {"nlmodels"},
    "datasets": {"datasets"},
    "nltrain": {"nlmodels", "datasets", "nltrain"},
    "tasks": {"nlmodels", "datasets", "nltrain", "tasks"},
    "flows": {"nlmodels", "datasets", "nltrain", "tasks", "flows"},
}
#: Floors that hold numbers, not orchestration: none may import an ORCHESTRATION library.
NUMERIC_FLOORS = ("nlmodels", "datasets", "nltrain")
ORCHESTRATION = {"prefect", "prefect_dask", "mlflow", "optuna", "dask", "distributed"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _source_module(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The dotted module a ``from ... import`` in module ``name`` reads from (relative resolved)."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imported_names(
    name: str, path: Path, type_checking: bool = True, tree: ast.Module | None = None
) -> set[str]:
    """Dotted names of everything ``name`` imports (a ``from pkg import sub`` counts as
    ``pkg.sub`` when ``sub`` is a module); ``type_checking`` False leaves out the imports of
    ``if TYPE_CHECKING:`` blocks (they name types, loading nothing); ``tree``: the module's
    parsed source, when already parsed."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not type_checking and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                module = _source_module(name, is_package, child)
                for alias in child.names:
                    full = f"{module}.{alias.name}"
                    out.add(full if full in MODULES else module)
            else:
                visit(child)

    visit(tree if tree is not None else ast.parse(path.read_text()))
    return out


def _own_module(dotted: str) -> str | None:
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


#: Modules every room may import: they import the standard library alone (checked below), so
#: they make no dependency between rooms. The packages' lazy faces (PEP 562) are made there.
PLUMBING = ("nlmodels.lazy",)


def _room_target(dotted: str) -> str | None:
    """The project's module ``dotted`` names, for the rooms' table: none for plumbing."""
    target = _own_module(dotted)
    return None if target in PLUMBING else target


#: Each module's parsed source, read once for every check below.
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}
#: What each module imports, ``if TYPE_CHECKING:`` blocks included: a circle of type-only
#: imports is a circle of the design all the same.
IMPORTS = {name: _imported_names(name, path, tree=TREES[name]) for name, path in MODULES.items()}
#: What each module loads when it runs (``if TYPE_CHECKING:`` blocks left out).
LOADS = {
    name: _imported_names(name, path, type_checking=False, tree=TREES[name])
    for name, path in MODULES.items()
}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    edges = {
        m: {t for n in names if (t := _own_module(n)) and t != m} for m, names in IMPORTS.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in edges:
        if v not in index:
            connect(v)
    return components


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(IMPORTS, "tasks", {*IMPORTS["tasks"], "flows.cli"})
    monkeypatch.setitem(IMPORTS, "flows.cli", {*IMPORTS["flows.cli"], "tasks"})
    assert any({"flows.cli", "tasks"} <= set(c) for c in _cycles())


@pytest.mark.parametrize("floor", PACKAGES)
def test_each_floor_imports_only_downwards(floor: str) -> None:
    wrong = {
        f"{module} imports {name}"
        for module, names in IMPORTS.items()
        if module.split(".")[0] == floor
        for name in names
        if ((top := name.split(".")[0]) in PACKAGES and top not in FLOOR_MAY_IMPORT[floor])
        or (floor in NUMERIC_FLOORS and top in ORCHESTRATION)
    }
    assert not wrong


# -- rooms ------------------------------------------------------------------------------------
#: The rooms of ``tasks`` and ``flows``: subpackages, each one concern behind one face (its
#: ``__init__``, whose ``__all__`` names what the other rooms use). Every other module of those
#: two packages is a room of its own, and each lower floor is one room.
ROOMS = (
    "tasks.config",
    "tasks.ledger",
    "tasks.machine",
    "tasks.reports",
    "tasks.tracking",
    "tasks.tuning",
    "flows.cli",
    "flows.ledger",
    "flows.reports",
    "flows.runtime",
    "flows.serve",
    "flows.studies",
)
LOWER_FLOORS = ("nlmodels", "datasets", "nltrain")
#: Which rooms each room may import (its own modules aside): every import across rooms, read
#: from the code, is one of these, and each of these is one the code makes. Read downwards:
#: a room is listed after every room it imports.
ROOM_MAY_IMPORT: dict[str, set[str]] = {
    "nlmodels": set(),
    "datasets": set(),
    "nltrain": {"datasets", "nlmodels"},
    "tasks._env": {"datasets"},
    "tasks.errors": {"nltrain"},
    "tasks.modelio": {"datasets", "nlmodels", "nltrain"},
    "tasks.offline": {"tasks._env"},
    "tasks._notify": {"tasks.offline"},
    "tasks.stopping": {"tasks.errors"},
    "tasks.config": {"datasets", "nlmodels", "nltrain", "tasks.stopping"},
    "tasks.tracking": {
        "datasets",
        "tasks.config",
        "tasks.errors",
        "tasks.modelio",
        "tasks.offline",
    },
    "tasks": {"nlmodels", "tasks._env", "tasks.config", "tasks.modelio", "tasks.tracking"},
    "tasks.results": {"tasks.config", "tasks.tracking"},
    "tasks.machine": {
        "datasets",
        "nlmodels",
        "nltrain",
        "tasks._notify",
        "tasks.config",
        "tasks.errors",
        "tasks.results",
        "tasks.tracking",
    },
    "tasks.reports": {"nltrain", "tasks.config", "tasks.results", "tasks.tracking"},
    "tasks.ledger": {
        "datasets",
        "nlmodels",
        "tasks.config",
        "tasks.machine",
        "tasks.reports",
        "tasks.tracking",
    },
    "tasks.progress": {"tasks.reports", "tasks.results"},
    "tasks.scratch": {"tasks.tracking"},
    "tasks.pipeline": {
        "datasets",
        "nlmodels",
        "nltrain",
        "tasks.config",
        "tasks.machine",
        "tasks.modelio",
        "tasks.reports",
        "tasks.scratch",
        "tasks.tracking",
    },
    "tasks.cell": {
        "nltrain",
        "tasks._notify",
        "tasks.config",
        "tasks.machine",
        "tasks.pipeline",
        "tasks.results",
        "tasks.stopping",
        "tasks.tracking",
    },
    "tasks.prefect_tasks": {
        "tasks.cell",
        "tasks.config",
        "tasks.errors",
        "tasks.machine",
        "tasks.offline",
        "tasks.reports",
        "tasks.results",
        "tasks.stopping",
        "tasks.tracking",
    },
    "tasks.engine": {
        "nlmodels",
        "nltrain",
        "tasks.cell",
        "tasks.config",
        "tasks.machine",
        "tasks.offline",
        "tasks.prefect_tasks",
        "tasks.progress",
        "tasks.reports",
        "tasks.results",
        "tasks.stopping",
    },
    "tasks.tuning": {
        "datasets",
        "nlmodels",
        "nltrain",
        "tasks.cell",
        "tasks.config",
        "tasks.errors",
        "tasks.offline",
        "tasks.stopping",
        "tasks.tracking",
    },
    "flows._study_catalog": set(),
    "flows.peers_page": {"tasks.config", "tasks.ledger", "tasks.reports"},
    "flows.runtime": {
        "datasets",
        "tasks.config",
        "tasks.errors",
        "tasks.machine",
        "tasks.offline",
        "tasks.prefect_tasks",
        "tasks.reports",
        "tasks.tracking",
    },
    "flows.studies": {
        "datasets",
        "flows._study_catalog",
        "flows.runtime",
        "nlmodels",
        "nltrain",
        "tasks.cell",
        "tasks.config",
        "tasks.engine",
        "tasks.ledger",
        "tasks.modelio",
        "tasks.offline",
        "tasks.reports",
        "tasks.results",
        "tasks.tracking",
    },
    "flows.reports": {
        "flows.runtime",
        "flows.studies",
        "tasks.config",
        "tasks.reports",
        "tasks.results",
        "tasks.tracking",
    },
    "flows.benchmark": {
        "flows.reports",
        "flows.runtime",
        "nlmodels",
        "tasks.cell",
        "tasks.config",
        "tasks.engine",
        "tasks.machine",
        "tasks.offline",
        "tasks.reports",
        "tasks.results",
        "tasks.tracking",
    },
    "flows": {"flows.benchmark"},
    "flows.ledger": {
        "flows._study_catalog",
        "flows.benchmark",
        "flows.studies",
        "tasks.config",
        "tasks.engine",
        "tasks.ledger",
        "tasks.machine",
        "tasks.progress",
        "tasks.reports",
        "tasks.results",
        "tasks.tracking",
    },
    "flows.study_pages": {"flows.ledger", "flows.studies", "tasks.ledger", "tasks.reports"},
    "flows.docs_measured": {"tasks.reports"},
    "flows.docs_numbers": {
        "flows.docs_measured",
        "flows.ledger",
        "flows.peers_page",
        "flows.study_pages",
        "tasks.ledger",
        "tasks.reports",
    },
    "flows.reproduce": {
        "flows.runtime",
        "flows.studies",
        "nlmodels",
        "nltrain",
        "tasks.cell",
        "tasks.config",
        "tasks.engine",
        "tasks.modelio",
        "tasks.offline",
        "tasks.reports",
        "tasks.results",
        "tasks.tracking",
    },
    "flows.tune": {"flows.runtime", "tasks.offline", "tasks.tracking", "tasks.tuning"},
    "flows.serve": {
        "flows.benchmark",
        "flows.reports",
        "flows.runtime",
        "flows.studies",
        "flows.tune",
        "tasks.config",
        "tasks.machine",
        "tasks.offline",
        "tasks.stopping",
        "tasks.tracking",
        "tasks.tuning",
    },
    "flows.cli": {
        "datasets",
        "flows._study_catalog",
        "flows.benchmark",
        "flows.ledger",
        "flows.reports",
        "flows.reproduce",
        "flows.runtime",
        "flows.serve",
        "flows.studies",
        "flows.tune",
        "nlmodels",
        "nltrain",
        "tasks",
        "tasks.cell",
        "tasks.config",
        "tasks.errors",
        "tasks.ledger",
        "tasks.machine",
        "tasks.reports",
        "tasks.scratch",
        "tasks.stopping",
        "tasks.tracking",
        "tasks.tuning",
    },
}
#: At most this many modules at the top of ``tasks`` and ``flows`` (``__init__`` included); the
#: rest are in rooms.
MAX_TOP_MODULES = 15
#: At most this many names in a face (a package's ``__all__``): what a user or another room
#: needs; a room's internals are imported from the module of the room that owns them.
MAX_FACE = 30


def _room(module: str) -> str:
    if module.split(".")[0] in LOWER_FLOORS:
        return module.split(".")[0]
    return next((r for r in ROOMS if module == r or module.startswith(f"{r}.")), module)


def _room_imports(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """room -> the other rooms its modules import."""
    out: dict[str, set[str]] = {}
    for module, names in imports.items():
        mine = out.setdefault(_room(module), set())
        mine |= {r for n in names if (t := _room_target(n)) and (r := _room(t)) != _room(module)}
    return out


def _circle_in(table: dict[str, set[str]]) -> list[str]:
    """A circle of ``table`` (room -> rooms), in order, or [] when it has none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(room: str) -> list[str]:
        state[room] = 1
        path.append(room)
        for other in sorted(table.get(room, ())):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (found := walk(other)):
                return found
        state[room] = 2
        path.pop()
        return []

    for room in sorted(table):
        if room not in state and (found := walk(room)):
            return found
    return []


def test_each_room_imports_only_the_rooms_the_table_names() -> None:
    made = _room_imports(IMPORTS)
    wrong = {
        f"{module} imports {target}"
        for module, names in IMPORTS.items()
        for n in names
        if (target := _room_target(n))
        and _room(target) != _room(module)
        and _room(target) not in ROOM_MAY_IMPORT.get(_room(module), set())
    }
    assert not wrong
    assert set(made) == set(ROOM_MAY_IMPORT), "every room, and only rooms, in the table"
    unused = {f"{r} -> {o}" for r, allowed in ROOM_MAY_IMPORT.items() for o in allowed - made[r]}
    assert not unused, f"table entries no longer needed: {sorted(unused)}"


@pytest.mark.parametrize("module", PLUMBING)
def test_plumbing_imports_the_standard_library_alone(module: str) -> None:
    outside = {
        n
        for n in _imported_names(module, MODULES[module])
        if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"
    }
    assert not outside, f"{module} may be imported by every room, so it imports no more"


def test_the_rooms_import_one_another_without_a_circle() -> None:
    assert _circle_in(ROOM_MAY_IMPORT) == []
    order = list(ROOM_MAY_IMPORT)
    later = {
        f"{r} -> {o}"
        for r, allowed in ROOM_MAY_IMPORT.items()
        for o in allowed
        if order.index(o) > order.index(r)
    }
    assert not later, "a room is listed after the rooms it imports"


def _top_modules(package: str) -> list[str]:
    return sorted(p.name for p in (ROOT / package).glob("*.py"))


@pytest.mark.parametrize("package", ["tasks", "flows"])
def test_tasks_and_flows_keep_few_modules_at_their_top(package: str) -> None:
    assert len(_top_modules(package)) <= MAX_TOP_MODULES, _top_modules(package)


def _faces() -> dict[str, list[str]]:
    """Each package's ``__all__`` (read by importing it: importing a package loads none of its
    modules)."""
    import importlib

    packages = [n for n, p in MODULES.items() if p.name == "__init__.py"]
    return {n: list(importlib.import_module(n).__all__) for n in packages}


def test_every_face_names_few_names() -> None:
    faces = _faces()
    assert set(ROOMS) | set(PACKAGES) <= set(faces)
    assert {n: len(names) for n, names in faces.items() if len(names) > MAX_FACE} == {}


def _faces_naming_modules(faces: dict[str, list[str]]) -> set[str]:
    """``package.name`` for each face name that is also a module of its package: once that
    module loads, the import system binds the module to the name, and the face then hands out
    the module where it promised the function."""
    return {
        f"{package}.{name}"
        for package, names in faces.items()
        for name in names
        if f"{package}.{name}" in MODULES
    }


def test_no_face_names_a_module_of_its_package() -> None:
    assert _faces_naming_modules(_faces()) == set()
    assert _faces_naming_modules({"tasks.reports": ["verdict", "Table"]}) == {
        "tasks.reports.verdict"
    }


def test_the_room_checks_catch_what_they_forbid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A report that imports the ledger (the ledger reads the reports), a circle of
    ``if TYPE_CHECKING:`` imports, a table with a circle, a room's private module imported
    from another room, and a 16th top module: each is caught."""
    made_up = "tasks.reports.made_up"
    monkeypatch.setitem(MODULES, made_up, ROOT / "tasks" / "reports" / "made_up.py")
    monkeypatch.setitem(IMPORTS, made_up, {"tasks.ledger.read_ledger"})
    with pytest.raises(AssertionError):
        test_each_room_imports_only_the_rooms_the_table_names()
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tasks.ledger import x\n"
    path = ROOT / "tasks" / "made_up.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    assert "tasks.ledger" in _imported_names("tasks.made_up", path)
    assert "tasks.ledger" not in _imported_names("tasks.made_up", path, type_checking=False)
    monkeypatch.undo()
    monkeypatch.setitem(IMPORTS, "tasks.ledger", {*IMPORTS["tasks.ledger"], "tasks.cell"})
    monkeypatch.setitem(IMPORTS, "tasks.cell", {*IMPORTS["tasks.cell"], "tasks.ledger"})
    assert any({"tasks.cell", "tasks.ledger"} <= set(c) for c in _cycles())
    assert _circle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle_in({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("from flows.runtime._prefect import flow_settings")
    assert _private_crossings("flows.benchmark", MODULES["flows.benchmark"], tree) == {
        "flows.runtime._prefect"
    }
    assert _private_crossings("flows.runtime", MODULES["flows.runtime"], tree) == set()
    monkeypatch.setattr(Path, "glob", lambda self, pattern: [Path(f"m{i}.py") for i in range(16)])
    with pytest.raises(AssertionError):
        test_tasks_and_flows_keep_few_modules_at_their_top("tasks")
    monkeypatch.undo()
    faces = _faces()
    monkeypatch.setitem(
        globals(), "_faces", lambda: {**faces, "tasks": [*"abcdefghijklmnopqrstuvwxyz", *"ABCDE"]}
    )
    with pytest.raises(AssertionError):
        test_every_face_names_few_names()


def test_no_module_outgrows_a_reader() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long


def test_flows_never_import_the_command_line() -> None:
    """Handlers call flows; a flow that imported ``flows.cli`` would make a command a flow's
    dependency (and bring back the cycles of re-exported parsers)."""
    wrong = {
        f"{module} imports {name}"
        for module, names in IMPORTS.items()
        if module.startswith("flows") and not module.startswith("flows.cli")
        for name in names
        if name == "flows.cli" or name.startswith("flows.cli.")
    }
    assert not wrong


def test_a_cell_result_is_built_only_by_its_constructors() -> None:
    """``CellResult(...)`` appears in one module, its own: everywhere else a result comes from
    ``CellResult.fresh``, ``.reused`` or ``.failed``, so no copy repeats a cell's identity."""
    builders = {
        name
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "CellResult"
    }
    assert builders <= {"tasks.results"}


MAX_PUBLIC_METHODS = 25
MAX_FUNCTION_LINES = 60
#: Floors whose functions are read top-down (orchestration, and the training loop's drivers),
#: so none longer than a screen.
SHORT_FUNCTION_FLOORS = ("nltrain", "tasks", "flows")
#: ``importer: imported private name`` -> why it may cross a module boundary.
PRIVATE_IMPORTS_ALLOWED: dict[str, str] = {}


def _long_functions(floors: tuple[str, ...], limit: int) -> dict[str, int]:
    return {
        f"{name}:{node.name}": length
        for name, tree in TREES.items()
        if name.split(".")[0] in floors
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := node.end_lineno - node.lineno + 1) > limit
    }


def _wide_classes(limit: int) -> dict[str, int]:
    return {
        f"{name}:{node.name}": count
        for name, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and (
            count := sum(
                isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and not m.name.startswith("_")
                for m in node.body
            )
        )
        > limit
    }


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports(trees: dict[str, ast.Module]) -> set[str]:
    """``importer: module.name`` for each private name taken from another module: imported
    (``from m import _f``) or reached through an imported module (``m._f``). A private *module*
    (``from pkg import _store``) is the package's own business, not a crossing."""
    found: set[str] = set()
    for name, tree in trees.items():
        is_package = MODULES[name].name == "__init__.py"
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _source_module(name, is_package, node)
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    if full in MODULES:
                        aliases[alias.asname or alias.name] = full
                    elif _is_private(alias.name) and _own_module(module) not in (None, name):
                        found.add(f"{name}: {module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _is_private(node.attr)
                and (module := aliases.get(ast.unparse(node.value)) or ast.unparse(node.value))
                in MODULES
                and module != name
                and f"{module}.{node.attr}" not in MODULES
            ):
                found.add(f"{name}: {module}.{node.attr}")
    return found


def test_no_class_has_more_public_methods_than_a_reader_holds() -> None:
    assert not _wide_classes(MAX_PUBLIC_METHODS)


def test_orchestration_functions_fit_on_a_screen() -> None:
    assert not _long_functions(SHORT_FUNCTION_FLOORS, MAX_FUNCTION_LINES)


def test_no_private_name_crosses_a_module_boundary() -> None:
    crossing = {entry: PRIVATE_IMPORTS_ALLOWED.get(entry) for entry in _private_imports(TREES)}
    assert {entry for entry, reason in crossing.items() if not reason} == set()
    unused = set(PRIVATE_IMPORTS_ALLOWED) - set(crossing)
    assert not unused, f"allow-list entries no longer needed: {sorted(unused)}"


def _private_part(dotted: str) -> str | None:
    """``dotted`` up to its first private part (``nltrain._loop`` of ``nltrain._loop.time``)."""
    parts = dotted.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if _is_private(part):
            return ".".join(parts[: i + 1])
    return None


#: The floors whose subpackages are rooms: a private module there is its room's own business.
#: Elsewhere a private module is its floor's.
ROOM_FLOORS = ("tasks", "flows")


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _owner(private: str) -> str:
    """Who may import ``private`` (a dotted name up to its first private part): the package that
    holds it in ``tasks`` and ``flows`` (a room, or the floor for its top modules), the floor
    elsewhere."""
    top = private.split(".")[0]
    return private.rpartition(".")[0] if top in ROOM_FLOORS else top


def _private_crossings(name: str, path: Path, tree: ast.Module) -> set[str]:
    """The private modules and names that module ``name`` imports from outside their owner
    (:func:`_owner`; each up to its first private part): ``tasks.machine._probe_cache`` is the
    machine room's own business and ``nltrain._loop`` the training floor's, reached from
    elsewhere only through a face (an ``__init__``) or a public module."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _source_module(name, is_package, node)
            dotted = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for d in dotted:
            if (
                d.split(".")[0] in PACKAGES
                and (part := _private_part(d))
                and not _inside(name, _owner(part))
            ):
                found.add(part)
    return found


def test_no_module_reaches_a_private_module_from_outside_its_package() -> None:
    wrong = {
        f"{name} imports {part}"
        for name, tree in TREES.items()
        for part in _private_crossings(name, MODULES[name], tree)
    }
    assert not wrong


TESTS = {f"tests.{p.stem}": p for p in sorted((ROOT / "tests").glob("*.py"))}
#: The internals tests check directly, each up to its first private part, and why a test needs
#: it rather than the package's face (a clock, a memory size or a cache to replace; a kernel or
#: a batched step compared with the formula it stands for). Nothing else crosses.
TEST_INTERNALS: dict[str, str] = {
    "datasets._cache": "a temporary file left by a crash, older than the cleanup age",
    "datasets._declared": "the memory a data file may take (faked) and its parser, unreached",
    "datasets._simulate": "the memory a data set may take (faked) and the data version",
    "datasets._systems": "the system registry, restored after a test declares systems",
    "flows.runtime._artifacts": "the Prefect artifact keys a study writes",
    "datasets._datafile": "the memory a file may take and the CSV chunk size, set for the test",
    "flows.runtime._dask": "the Dask task runner's checks and errors, without a cluster",
    "flows.runtime._prefect": "the servers a flow starts, stopped on interrupt",
    "flows.cli.study._config": "the study command's config, from its flags",
    "flows.runtime._temporary_server": "the temporary server's port and its start beside another",
    "flows.serve._schedules": "each key of each kind of schedule entry, read from the entry types",
    "flows._study_catalog": "the study catalogue against the studies registered",
    "flows.studies._config": "the studies' quick training protocol",
    "nlmodels._cpu": "the CPU numerics mode's facts: the variable, the target, the CPU's flags",
    "nlmodels.accel.gru._NativeGRU": "the native GRU kernel against torch's formula",
    "nlmodels.accel.gru._WavefrontGRU": "the wavefront GRU kernel against torch's formula",
    "nlmodels.accel.native._store": "where the native kernels are built and their cache key",
    "nlmodels.baselines._dopri": "the Dormand-Prince tableau and the batched solver's lanes",
    "nlmodels.baselines._dopri_adjoint": "the dopri5 adjoint twin against torchdiffeq's, its "
    "step control's error ratios watched",
    "nlmodels.baselines._mlp": "the stacked (batched) MLP against one member's",
    "nlmodels.baselines._euler": "the Euler solve the packed step is compared with, and its "
    "adjoint twin against torchdiffeq's",
    "nlmodels.baselines._solve": "the eager adjoint swapped for torchdiffeq's, so that a model "
    "and a cell's training are compared through each",
    "nltrain.numerics._fingerprints": "the fingerprint cache (folder, memo) replaced per test, and "
    "the canaries traced against the cells they stand for",
    "nltrain._checkpoints": "the models' random streams, found, saved and put back",
    "nltrain._evaluation": "the divergence factor and the top-error share, at their thresholds",
    "nltrain._loop": "the training loop's clock, replaced to test time budgets, and its epoch bar",
    "nltrain._member_products": "per-member products against the batched ones, bit for bit",
    "nltrain._packed_cells": "a pack of one, built directly",
    "nltrain.numerics._pinned": "the check of the pinned bytes, replaced to test where it is kept",
    "nlmodels.accel.native._selftest": "the kernels' self-test, given a library made to miscompute",
    "nltrain._packed_gru": "the plain GRU the packs train, against torch's",
    "nltrain._packer": "the batched step, built directly",
    "nltrain._steps": "a split's tensors and the epoch readout, built directly",
    "nltrain._training": "the allocator setting a CPU step makes, replaced to see it made",
    "tasks.machine.placement._probe_key": "the placement probe's cache key",
}


def test_tests_reach_only_the_internals_they_check() -> None:
    reached = {
        part
        for name, path in TESTS.items()
        for part in _private_crossings(name, path, ast.parse(path.read_text()))
    }
    assert reached - set(TEST_INTERNALS) == set()
    unused = set(TEST_INTERNALS) - reached
    assert not unused, f"allow-list entries no longer needed: {sorted(unused)}"


def _module_lookups(tree: ast.Module) -> set[str]:
    """Project modules looked up in ``sys.modules`` (``sys.modules[...]``, ``.get(...)``,
    ``... in sys.modules``): a module is imported, not fished out of the interpreter."""

    def is_sys_modules(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.modules"

    keys: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_sys_modules(node.value):
            keys.append(node.slice)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and is_sys_modules(node.func.value)
        ):
            keys += node.args[:1]
        elif isinstance(node, ast.Compare) and any(map(is_sys_modules, node.comparators)):
            keys.append(node.left)
    return {
        k.value
        for k in keys
        if isinstance(k, ast.Constant)
        and isinstance(k.value, str)
        and k.value.split(".")[0] in PACKAGES
    }


def test_no_project_module_is_looked_up_in_sys_modules() -> None:
    assert {name: found for name, tree in TREES.items() if (found := _module_lookups(tree))} == {}


def test_only_the_tracking_package_imports_mlflow() -> None:
    wrong = {
        f"{module} imports {name}"
        for module, names in IMPORTS.items()
        if not (module == "tasks.tracking" or module.startswith("tasks.tracking."))
        for name in names
        if name.split(".")[0] == "mlflow"
    }
    assert not wrong


#: Attribute chains of MLflow's entities (``Run.data``, ``Run.info``): who reads them reads
#: MLflow's layout, which only the tracking package knows; elsewhere runs are the platform's
#: own records (:mod:`tasks.tracking.records`).
MLFLOW_DATA_FIELDS = {"tags", "metrics", "params"}
MLFLOW_INFO_FIELDS = {
    "run_id",
    "run_uuid",
    "run_name",
    "status",
    "start_time",
    "end_time",
    "artifact_uri",
    "lifecycle_stage",
    "experiment_id",
    "user_id",
}


SETTINGS_DOOR = "tasks.offline"


def _top_level_imports(tree: ast.Module) -> set[str]:
    """The modules a module imports at its top level (``import a.b`` gives ``a.b``)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def _orchestration_without_settings() -> set[str]:
    """Modules that import Prefect, MLflow or Optuna (anywhere in them) while neither they nor an
    enclosing package of theirs imports :mod:`tasks.offline` at its top level: the libraries
    would load before the platform's settings (telemetry off, the homes) unless something else
    happened to set them first."""
    out = set()
    for name, imported in LOADS.items():
        if name == SETTINGS_DOOR or not {n.split(".")[0] for n in imported} & ORCHESTRATION:
            continue
        parts = name.split(".")
        enclosing = [".".join(parts[:i]) for i in range(2, len(parts) + 1)]
        if not any(SETTINGS_DOOR in _top_level_imports(TREES[m]) for m in enclosing if m in TREES):
            out.add(name)
    return out


def test_orchestration_libraries_load_after_the_platforms_settings() -> None:
    assert _orchestration_without_settings() == set()


def _mlflow_entity_reads(trees: dict[str, ast.Module]) -> set[str]:
    """``module: .data.tags`` (or ``.info.run_id``, ...) for each read of an MLflow entity's
    fields outside :mod:`tasks.tracking`."""
    found: set[str] = set()
    for name, tree in trees.items():
        if name == "tasks.tracking" or name.startswith("tasks.tracking."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                middle, last = node.value.attr, node.attr
                if (middle == "data" and last in MLFLOW_DATA_FIELDS) or (
                    middle == "info" and last in MLFLOW_INFO_FIELDS
                ):
                    found.add(f"{name}: .{middle}.{last}")
    return found


def test_only_the_tracking_package_reads_mlflow_entities() -> None:
    assert not _mlflow_entity_reads(TREES)


#: The modules of ``flows.cli`` that every command shares (the others are one command each).
CLI_SHARED = {"flows.cli", "flows.cli.common", "flows.cli.values", "flows.cli.__main__"}


def _commands_importing_commands() -> set[str]:
    """Command modules importing other commands, and private parts (``flows.cli._name``: one
    command's, split off its module) imported by more than one command."""
    modules = {m for m in MODULES if m.startswith("flows.cli.") and m not in CLI_SHARED}
    commands = {m for m in modules if not m.rpartition(".")[2].startswith("_")}
    users: dict[str, set[str]] = {}
    found = set()
    for module in modules:
        for imported in IMPORTS[module]:
            target = _own_module(imported)
            if target in commands and target != module:
                found.add(f"{module} imports {target}")
            elif target in modules - commands and module in commands:
                users.setdefault(target, set()).add(module)
    shared = {f"{t} serves {', '.join(sorted(u))}" for t, u in users.items() if len(u) > 1}
    return found | shared


def test_no_command_module_imports_another() -> None:
    """What two commands share lives in ``flows/cli/common.py`` or a flows module; a command's
    private part (``flows/cli/_name.py``) serves that one command."""
    assert not _commands_importing_commands()


def test_the_shape_checks_catch_what_they_forbid() -> None:
    """Each rule above on a made-up module that breaks it."""
    source = "\n".join(
        [
            "from tasks.pipeline import _hidden",
            "from tasks import pipeline",
            "class Wide:",
            *[f"    def m{i}(self): pass" for i in range(MAX_PUBLIC_METHODS + 1)],
            "def long():",
            *["    x = 1"] * MAX_FUNCTION_LINES,
            "y = pipeline._other",
            "from datasets._cache import data_home",
            "import nltrain._loop",
            "m = sys.modules.get('datasets._cache')",
            "z = run.data.tags, run.info.run_id, system.info.name, frame.data.shape",
        ]
    )
    tree = ast.parse(source)
    name = "tasks.made_up"
    MODULES[name] = ROOT / "tasks" / "made_up.py"
    try:
        TREES[name] = tree
        assert _wide_classes(MAX_PUBLIC_METHODS) == {f"{name}:Wide": MAX_PUBLIC_METHODS + 1}
        assert f"{name}:long" in _long_functions(("tasks",), MAX_FUNCTION_LINES)
        assert _private_imports({name: tree}) == {
            f"{name}: tasks.pipeline._hidden",
            f"{name}: tasks.pipeline._other",
        }
        assert _private_crossings(name, MODULES[name], tree) == {
            "datasets._cache",
            "nltrain._loop",
            "tasks.pipeline._hidden",
        }
        assert _module_lookups(tree) == {"datasets._cache"}
        assert _mlflow_entity_reads({name: tree}) == {
            f"{name}: .data.tags",
            f"{name}: .info.run_id",
        }
        LOADS[name] = {"prefect.flow"}  # Prefect without the platform's settings first
        assert _orchestration_without_settings() == {name}
        TREES[name] = ast.parse("import tasks.offline\nimport prefect")
        assert _orchestration_without_settings() == set()
    finally:
        LOADS.pop(name, None)
        del MODULES[name], TREES[name]
    command = "flows.cli.made_up"
    MODULES[command] = ROOT / "flows" / "cli" / "made_up.py"
    IMPORTS[command] = {
        "flows.cli.compare.comparison_section",
        "flows.cli.common",
        "flows.cli._ledger_args.add_selection",  # the ledger command's own part
    }
    try:
        assert _commands_importing_commands() == {
            f"{command} imports flows.cli.compare",
            f"flows.cli._ledger_args serves flows.cli.ledger, {command}",
        }
    finally:
        del MODULES[command], IMPORTS[command]


_COMPUTING = ("torch", "nlmodels", "nltrain", "datasets", "tasks", "flows", "benchmarks")


def _scripts_without_numerics() -> set[str]:
    """Runnable scripts (a ``__main__`` block) that import torch or a project floor but never
    set up the CPU numerics: their first training call after any torch computation refuses."""
    missing = set()
    for path in sorted((*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py"))):
        tree = ast.parse(path.read_text())
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        mains = [
            node
            for node in tree.body
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        ]
        if not mains or not imported & set(_COMPUTING):
            continue
        calls = {
            ast.unparse(n.func).rsplit(".", 1)[-1]
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
        }
        if "set_up_numerics" not in calls:
            missing.add(path.relative_to(ROOT).as_posix())
    return missing


def test_every_script_sets_up_the_numerics_before_it_computes() -> None:
    assert _scripts_without_numerics() == set()
