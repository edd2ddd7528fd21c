"""The six recipes of docs/architecture.md followed on made-up examples, in a scratch copy of
the source tree: a model (its module and one table of ``nlmodels/models.toml``: nothing else),
a system, a study, a ledger table, a numerics check and a command, each touching only the files
its recipe names; then one process checks that each shows up where the recipe says (``nllab
models``, the main table and its ranking, the quick profile, ``nllab tune``'s check and search
space, ``nllab systems``, ``nllab study --help``, the ledger's tables, ``nllab doctor``, ``nllab
--help``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nlmodels", "datasets", "nltrain", "tasks", "flows")

# -- recipe "add a model": nlmodels/toy_mean.py and one table of nlmodels/models.toml ---------
TOY_MODEL = '''
import torch
from nlmodels.base import ForecastModel, batch_times
from nlmodels.model_registry import register_model


@register_model("toy_mean")
class ToyMean(ForecastModel):
    """Forecasts the mean of the observed points, plus a learned drift in time."""

    def __init__(self, state_dim: int, hidden: int = 8) -> None:
        super().__init__()
        self.state_dim = state_dim
        self.drift = torch.nn.Linear(1, state_dim)

    def forward(self, obs_t, obs_x, query_t):
        t = batch_times(query_t, obs_x.shape[0]).unsqueeze(-1)
        return obs_x.mean(dim=1, keepdim=True) + self.drift(t)
'''
TOY_CARD = """
[toy_mean]
module = "nlmodels.toy_mean"
label = "ToyMean"
main_table = true
quick_epochs = 7
"""

# -- recipe "add a system": a SystemSpec in datasets/_systems.py, its name in tasks/config/names.py
# --
TOY_SYSTEM = """        SystemSpec(
            _info("toy_wave", 1, ("periodic",), "x = sin(t + x0)", ("phase",), _WAVE_GRID, _PHASES),
            _lin(0.1, 20.0),
            _waveform(_closed.sine),
        ),
    ]
}

#: The built-in systems"""

# -- recipe "add a study": flows/studies/toy_study.py and its entry in flows/_study_catalog.py -
TOY_STUDY = """
from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, rmse_table

SPEC = StudySpec(name="toy-study")


def _body(ctx: StudyContext) -> StudyOutput:
    entries = [({"method": m}, ctx.cell("sine", m, 0)) for m in ctx.methods(("node",))]
    return StudyOutput({"toy": rmse_table(ctx, entries, ("method",))})


STUDY = Study(SPEC, _body)
"""
TOY_STUDY_ENTRY = """            StudyEntry("toy-study", "A made-up study", "no paper table"),
        )
    }
)"""

# -- recipe "add a ledger table": a view in tasks/ledger/views.py, its place in flows/ledger/text.py
TOY_VIEW = '''

def toy_seeds_table(status: LedgerStatus) -> Table:
    """The recorded seeds of each method of Table 3 (a made-up view)."""
    counted = status.counted(ablation=False)
    methods = sorted({s.cell.method for s in status.states if not s.cell.ablation})
    rows = tuple(
        (TableCell(m), TableCell(str(sum(r.method == m for r in counted)))) for m in methods
    )
    return Table(("method", "seeds recorded"), rows, "Recorded seeds per method (made up).")
'''

# -- recipe "add a numerics check": a check in tasks/machine/doctor.py and its place in diagnose --
TOY_CHECK = '''

def _toy_check(setup) -> Iterator[Finding]:
    """A made-up check: the numerics mode in effect, named."""
    yield Finding("toy numerics", "mode seen", setup.mode, "ok")
'''

# -- recipe "add a command": flows/cli/hello.py and its place in flows/cli/__init__.py --------
TOY_COMMAND = """
import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("hello", help="say hello (a made-up command)")
    p.add_argument("--name", default="world")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    print(f"hello, {args.name}")
    return 0
"""

CHECK = r"""
import contextlib, io, json, optuna
from flows.cli import main
from flows.cli.common import check_names
from nlmodels import build_model
from tasks.config import METHODS, SYSTEM_NAMES, resolve_config
from tasks.reports.reporting import results_table
from tasks.results import CellResult
from tasks.tuning.search_spaces import search_space
from tasks.reports.tables import render_table

def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue() + err.getvalue()

got = {"methods": list(METHODS), "systems": list(SYSTEM_NAMES)}
config = resolve_config("quick", None, {"systems": ["toy_wave"]})
got["quick"] = [(c.method, c.training.epochs) for c in config.cells() if c.method == "toy_mean"]
model = build_model("toy_mean", state_dim=2)
got["forward"] = list(model(*(__import__("torch").zeros(s) for s in ((5,), (3, 5, 2), (4,)))).shape)
rows = [CellResult("integro_de", m, 0, "finished", test_rmse=v)
        for m, v in (("node", 0.3), ("neural_laplace", 0.2), ("toy_mean", 0.1))]
table = results_table(rows, profile="quick")
got["table_rows"] = table.methods
got["table"] = table.to_markdown()
draw = search_space("toy_mean").draw(optuna.trial.FixedTrial({"hidden": 16, "lr": 0.01}))
got["space"] = [draw.model, draw.training]
check_names(systems=["toy_wave"], methods=["toy_mean"])  # `nllab tune`'s check: no error
got["tune_typo"] = cli("tune", "--method", "toy_maen", "--system", "toy_wave", "--trials", "1")
got["models"] = cli("models")
got["model_options"] = cli("models", "toy_mean")
got["names"] = cli("models", "--names")
got["systems_cli"] = cli("systems")
got["study_help"] = cli("study", "--help")
got["study_own_help"] = cli("study", "toy-study", "--help")
got["hello"] = cli("hello", "--name", "recipe")
got["help"] = cli("--help")
from flows.ledger import tables
from tasks.ledger import LedgerCell, ledger_status
cells = [LedgerCell(s, m, 0, f"{s}/{m}", None) for s in ("spiral_dde", "integro_de")
         for m in ("node", "neural_laplace")]
got["ledger_table"] = tables(ledger_status([], cells), "markdown")
import nltrain.numerics._pinned as pinned
pinned.pinned_mismatches = lambda: []  # the pins themselves: tests/test_cpu_numerics.py
got["doctor"] = cli("doctor")
from flows.studies import get_study
got["study"] = get_study("toy-study").spec.title
print(json.dumps(got))
"""


def _follow_recipes(tree: Path) -> dict[str, list[str]]:
    """Apply the four recipes to the copy in ``tree``; returns the files each touched."""
    touched: dict[str, list[str]] = {}

    def write(recipe: str, rel: str, text: str) -> None:
        (tree / rel).write_text(text)
        touched.setdefault(recipe, []).append(rel)

    def edit(recipe: str, rel: str, old: str, new: str) -> None:
        text = (tree / rel).read_text()
        assert text.count(old) == 1, f"{rel}: the recipe's anchor {old!r} moved"
        write(recipe, rel, text.replace(old, new))

    write("model", "nlmodels/toy_mean.py", TOY_MODEL)
    write("model", "nlmodels/models.toml", (tree / "nlmodels/models.toml").read_text() + TOY_CARD)
    edit("system", "datasets/_systems.py", "    ]\n}\n\n#: The built-in systems", TOY_SYSTEM)
    edit(
        "system",
        "tasks/config/names.py",
        '    "stiff_van_der_pol",\n)',
        '    "stiff_van_der_pol",\n    "toy_wave",\n)',
    )
    write("study", "flows/studies/toy_study.py", TOY_STUDY)
    edit("study", "flows/_study_catalog.py", "        )\n    }\n)", TOY_STUDY_ENTRY)
    views = "tasks/ledger/views.py"
    write("ledger table", views, (tree / views).read_text() + TOY_VIEW)
    edit(
        "ledger table",
        "flows/ledger/text.py",
        '    width = 160 if fmt == "terminal" else 100',
        "    from tasks.ledger.views import toy_seeds_table\n\n"
        '    width = 160 if fmt == "terminal" else 100',
    )
    edit(
        "ledger table",
        "flows/ledger/text.py",
        '    return "\\n\\n".join(parts)\n\n\ndef ledger_markdown',
        "    parts.append(render_table(toy_seeds_table(status), fmt, width=width))\n"
        '    return "\\n\\n".join(parts)\n\n\ndef ledger_markdown',
    )
    doctor = "tasks/machine/doctor.py"
    write("numerics check", doctor, (tree / doctor).read_text() + TOY_CHECK)
    edit(
        "numerics check",
        doctor,
        "        *_pinned(setup, fresh),\n    ]",
        "        *_pinned(setup, fresh),\n        *_toy_check(setup),\n    ]",
    )
    write("command", "flows/cli/hello.py", TOY_COMMAND)
    edit(
        "command",
        "flows/cli/__init__.py",
        "    doctor,\n    ledger,",
        "    doctor,\n    hello,\n    ledger,",
    )
    edit(
        "command",
        "flows/cli/__init__.py",
        "    doctor,\n)\n\n\ndef build",
        "    doctor,\n    hello,\n)\n\n\ndef build",
    )
    return touched


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> tuple[dict, dict[str, list[str]]]:
    tmp = tmp_path_factory.mktemp("recipes")
    tree = tmp / "tree"
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    touched = _follow_recipes(tree)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(tree), NLLAB_HOME=str(tmp / "home"))
    r = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tmp, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), touched


@pytest.mark.heavy  # a benchmark of a model added by the recipe
def test_a_model_for_the_main_table_is_its_module_and_one_registration(recipes):
    got, touched = recipes
    assert touched["model"] == ["nlmodels/toy_mean.py", "nlmodels/models.toml"]
    assert got["methods"][-1] == "toy_mean"  # a row of the main table, a default of benchmarks
    assert got["quick"] == [["toy_mean", 7]]  # its registration's quick epochs
    assert got["forward"] == [3, 4, 2]
    assert got["table_rows"][-1] == "toy_mean"
    assert "| toy_mean | **0.1** (not in the paper) |" in got["table"]  # no paper figure
    # its search space is derived from its typed options (hidden: a quarter to four times 8)
    assert got["space"] == [{"hidden": 16}, {"lr": 0.01}]
    code, out = got["models"]
    assert code == 0 and "toy_mean" in out and "7 epochs" in out.split("toy_mean", 1)[1]
    code, out = got["model_options"]
    assert code == 0 and "options: hidden=8" in out
    assert got["names"][1].split().count("toy_mean") == 1
    code, out = got["tune_typo"]
    assert code == 2 and "toy_mean" in out  # the valid choices include it


def test_a_system_a_study_and_a_command_show_up_where_their_recipes_say(recipes):
    got, touched = recipes
    assert touched["system"] == ["datasets/_systems.py", "tasks/config/names.py"]
    assert "toy_wave" in got["systems"] and "toy_wave" in got["systems_cli"][1]
    assert touched["study"] == ["flows/studies/toy_study.py", "flows/_study_catalog.py"]
    assert got["study"] == "A made-up study"
    assert "toy-study" in got["study_help"][1] and "A made-up study" in got["study_own_help"][1]
    assert touched["command"] == [
        "flows/cli/hello.py",
        "flows/cli/__init__.py",
        "flows/cli/__init__.py",
    ]
    assert got["hello"] == [0, "hello, recipe\n"]
    assert "hello" in got["help"][1]


def test_a_ledger_table_and_a_numerics_check_show_up_where_their_recipes_say(recipes):
    got, touched = recipes
    assert touched["ledger table"] == [
        "tasks/ledger/views.py",
        "flows/ledger/text.py",
        "flows/ledger/text.py",
    ]
    out = got["ledger_table"]
    assert "Recorded seeds per method (made up)." in out
    assert "| node | 0 |" in out and "| neural_laplace | 0 |" in out
    assert out.index("Recorded seeds per method") > out.index("of Table 3 recorded")
    assert touched["numerics check"] == ["tasks/machine/doctor.py", "tasks/machine/doctor.py"]
    code, out = got["doctor"]
    assert code in (0, 1), out
    section = out.split("\ntoy numerics\n", 1)[1]
    assert section.lstrip().startswith("✓ mode seen") and "portable" in section.split("\n")[0]
