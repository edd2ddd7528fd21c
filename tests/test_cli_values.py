"""Every option of every ``nllab`` command, given values nobody wrote a case for: each is
refused with exit code 2 and a one-line message, or accepted and handed to the work (stubbed
here) — never a traceback. The options are read from the parser, so an option added later is
in it."""

from __future__ import annotations

import argparse
import importlib

import pytest

from flows.cli import build_parser, main

#: Below, at and far past any bound, not finite, of another kind, empty, a path below a file.
_ABSURD = ("-1", "0", "1e12", "nan", "inf", "bogus", "", ",", "/dev/null/x", "0.5")

#: What each command needs besides the option (a positional argument).
_BASE = {
    "study": ["stereographic"],
    "reproduce": ["models:/nl-x@champion"],
    "ledger": ["status"],
}

#: Where each command's work starts: stubbed, so an accepted value ends there.
_WORK = (
    ("flows.benchmark", "run_benchmark"),
    ("flows.studies", "run_study"),
    ("flows.tune", "run_tune"),
    ("flows.reproduce", "reproduce"),
    ("flows.serve.serve_loop", "serve_deployments"),
    ("flows.ledger", "run_ledger"),
    ("flows.ledger", "record_store"),
    ("flows.cli.ui", "ui_command"),
    ("tasks.cell", "simulate_data"),
)


class _Accepted(Exception):
    """The command reached its work with the value."""


def _options() -> list[tuple[str, str, str]]:
    """(command, option, the ledger action it applies to) for every option taking a value."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for command, parser in sub.choices.items():
        scoped = {o.dest: actions[0] for o, actions in parser.get_default("scoped") or ()}
        for action in parser._actions:
            if action.option_strings and action.nargs != 0 and not action.choices:
                out.append((command, action.option_strings[-1], scoped.get(action.dest, "")))
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One home for all: its caches (the ledger's config hashes) are made once."""
    return tmp_path_factory.mktemp("home")


def _import_what_binds_the_work_by_name() -> None:
    """Import every module that binds a stubbed function by name (``from tasks.cell import
    simulate_data``): one first imported while the stubs are in place would keep a stub after
    this module's tests, for every later test in the process (the studies' modules load only
    when a command asks for one)."""
    from flows.studies import STUDIES

    for name in STUDIES:
        STUDIES[name]
    for module in ("flows.reproduce", "flows.cli.simulate"):
        importlib.import_module(module)


@pytest.fixture
def work_stubbed(monkeypatch, tmp_path, home):
    def reached(*args, **kwargs):
        raise _Accepted

    _import_what_binds_the_work_by_name()
    for module, name in _WORK:
        monkeypatch.setattr(importlib.import_module(module), name, reached)
    import flows.cli.common as cli

    monkeypatch.setattr(cli, "check_registry_uri", lambda uri: None)  # as if registered
    monkeypatch.setenv("NLLAB_HOME", str(home))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("command", "option", "action"), _options())
def test_any_value_of_any_option_is_refused_in_one_line_or_reaches_the_work(
    command, option, action, work_stubbed, capfd
):
    base = list(_BASE.get(command, []))
    if action:
        base[0] = action
    for value in _ABSURD:
        argv = [command, *base, option, value]
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: exit 2 with its message
            code = e.code
        except _Accepted:
            continue
        err = capfd.readouterr().err
        assert "Traceback" not in err, (argv, err)
        # 0/1: a command that reads (an empty store, a ledger) answered; 2: refused, saying why
        assert code in (0, 1, 2), (argv, code, err)
        if code == 2:
            assert f"nllab {command}: error: " in err or "error: argument" in err, (argv, err)
