"""The shape of the code, read from its import statements (every one, function-level included):
the floors ``nlmodels``/``datasets`` → ``nltrain`` → ``tasks`` → ``flows`` only import downwards,
no module imports itself back through others, and no module outgrows a reader (500 lines)."""

from __future__ import annotations

import ast
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


def _imported_names(name: str, path: Path) -> set[str]:
    """Dotted names of everything ``name`` imports (a ``from pkg import sub`` counts as
    ``pkg.sub`` when ``sub`` is a module), outside ``if TYPE_CHECKING:`` blocks."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
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

    visit(ast.parse(path.read_text()))
    return out


def _own_module(dotted: str) -> str | None:
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


IMPORTS = {name: _imported_names(name, path) for name, path in MODULES.items()}


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


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


TREES = _trees()


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


def _private_crossings(name: str, path: Path, tree: ast.Module) -> set[str]:
    """The private modules and names of the other packages that module ``name`` imports (each
    up to its first private part): another package's private module is that package's own
    business, reached only through its face (its ``__init__``)."""
    is_package, own = path.name == "__init__.py", name.split(".")[0]
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
                and d.split(".")[0] != own
                and (part := _private_part(d))
            ):
                found.add(part)
    return found


def test_no_package_imports_another_packages_private_module() -> None:
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
    "flows._artifacts": "the Prefect artifact keys a study writes",
    "datasets._datafile": "the memory a file may take and the CSV chunk size, set for the test",
    "flows._dask": "the Dask task runner's checks and errors, without a cluster",
    "flows._runtime": "the servers a flow starts, stopped on interrupt",
    "flows._schedules": "each key of each kind of schedule entry, read from the entry types",
    "flows._study_catalog": "the study catalogue against the studies registered",
    "flows.studies._config": "the studies' quick training protocol",
    "nlmodels._cpu": "the CPU numerics mode's facts: the variable, the target, the CPU's flags",
    "nlmodels._numerics": "the CPU numerics mode's pinned environment and tags",
    "nlmodels.accel.gru._NativeGRU": "the native GRU kernel against torch's formula",
    "nlmodels.accel.gru._WavefrontGRU": "the wavefront GRU kernel against torch's formula",
    "nlmodels.accel.native._store": "where the native kernels are built and their cache key",
    "nlmodels.baselines._dopri": "the Dormand-Prince tableau and the batched solver's lanes",
    "nlmodels.baselines._mlp": "the stacked (batched) MLP against one member's",
    "nlmodels.baselines._solve": "the fixed-step Euler solve the packed step is compared with",
    "nltrain._fingerprints": "the fingerprint cache (folder, memo) replaced per test, and "
    "the canaries traced against the cells they stand for",
    "nltrain._loop": "the training loop's clock, replaced to test time budgets",
    "nltrain._member_products": "per-member products against the batched ones, bit for bit",
    "nltrain._packed_cells": "a pack of one, built directly",
    "nltrain._pinned": "the check of the pinned bytes, replaced to test where it is kept",
    "nltrain._packer": "the batched step, built directly",
    "nltrain._steps": "a split's tensors and the epoch readout, built directly",
    "tasks._declarations": "the declared systems, restored after a test declares systems",
    "tasks._workers": "worker processes killed and counted",
    "tasks.placement._probe_key": "the placement probe's cache key",
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
    for name, imported in IMPORTS.items():
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
CLI_SHARED = {"flows.cli", "flows.cli.common", "flows.cli.__main__"}


def _commands_importing_commands() -> set[str]:
    commands = {m for m in MODULES if m.startswith("flows.cli.") and m not in CLI_SHARED}
    return {
        f"{module} imports {target}"
        for module in commands
        for imported in IMPORTS[module]
        if (target := _own_module(imported)) in commands and target != module
    }


def test_no_command_module_imports_another() -> None:
    """What two commands share lives in ``flows/cli/common.py`` or a flows module."""
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
        assert _private_crossings(name, MODULES[name], tree) == {"datasets._cache", "nltrain._loop"}
        assert _module_lookups(tree) == {"datasets._cache"}
        assert _mlflow_entity_reads({name: tree}) == {
            f"{name}: .data.tags",
            f"{name}: .info.run_id",
        }
        IMPORTS[name] = {"prefect.flow"}  # Prefect without the platform's settings first
        assert _orchestration_without_settings() == {name}
        TREES[name] = ast.parse("import tasks.offline\nimport prefect")
        assert _orchestration_without_settings() == set()
    finally:
        IMPORTS.pop(name, None)
        del MODULES[name], TREES[name]
    command = "flows.cli.made_up"
    MODULES[command] = ROOT / "flows" / "cli" / "made_up.py"
    IMPORTS[command] = {"flows.cli.compare.comparison_section", "flows.cli.common"}
    try:
        assert _commands_importing_commands() == {f"{command} imports flows.cli.compare"}
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
