"""The ``nllab`` command line: help, exit codes, error messages, the commands themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flows.cli import build_parser, main, ui_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", ["simulate", "benchmark", "report", "ui"])
def test_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: nllab {command}" in out
    if command != "ui":
        assert "--profile" in out and "--systems" in out and "--config" in out
    if command == "benchmark":
        for flag in ("--methods", "--seeds", "--device", "--max-workers", "--task-runner"):
            assert flag in out


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ("simulate", "benchmark", "report", "ui"):
        assert command in out


def test_console_entry_point_runs(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "flows.cli", "benchmark", "--help"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NLLAB_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "--profile {smoke,quick,paper,fair}" in r.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["benchmark", "--systems", "spiral"], "unknown system 'spiral' (did you mean"),
        (["benchmark", "--methods", "node,laplace"], "unknown method 'laplace' (did you mean"),
        (["report", "--seeds", "one"], "--seeds takes non-negative integers"),
        (["simulate", "--seeds", "-1"], "seeds must be distinct non-negative integers"),
    ],
)
def test_bad_names_exit_2_with_choices(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    if "unknown system" in message:
        assert "spiral_dde" in err and "integro_de" in err
    if "unknown method" in message:
        assert "neural_laplace" in err


@pytest.mark.parametrize(
    ("argv", "nearest"),
    [
        (["benchmark", "--methods", "nod"], "unknown method 'nod' (did you mean 'node'?); valid: "),
        (["benchmark", "--systems", "integro"], "'integro' (did you mean 'integro_de'?); valid: "),
        (["study", "noise", "--methods", "neural_laplase"], "(did you mean 'neural_laplace'?)"),
        (["benchmark", "--methods", "zzz"], "unknown method 'zzz'; valid: anode, "),
    ],
)
def test_a_misspelt_name_is_one_line_with_the_nearest_valid_name(argv, nearest, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert nearest in err and len(err.strip().splitlines()) == 1, err


def test_argparse_usage_errors_exit_2(capsys):
    for argv in (["benchmark", "--profile", "huge"], ["frobnicate"], []):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_bad_config_file_exits_2(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text("[training]\nepochs = -3\n")
    assert main(["benchmark", "--config", str(f)]) == 2
    assert "training.epochs" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_request_without_gpu_exits_2(capsys):
    assert main(["benchmark", "--profile", "smoke", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_unreachable_tracking_exits_3(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert main(["report", "--profile", "smoke", "--systems", "integro_de"]) == 3
    assert "cannot use the MLflow tracking store at 'http://127.0.0.1:9'" in capsys.readouterr().err


def test_unreachable_tracking_stops_benchmark_before_any_run(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert main(["benchmark", "--profile", "smoke", "--systems", "integro_de"]) == 3
    assert "Check MLFLOW_TRACKING_URI" in capsys.readouterr().err


def test_simulate_prints_data_sets(capsys):
    assert (
        main(["simulate", "--profile", "smoke", "--systems", "integro_de", "--seeds", "0,1"]) == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("N=40 T=200 D=1" in line for line in lines)


def test_report_on_empty_store_says_so_and_fails(mlflow_store, tmp_path, capsys):
    out = tmp_path / "rep"
    # no benchmark at all: nothing to default to
    assert main(["report", "--out", str(out)]) == 1
    assert "no finished benchmark" in capsys.readouterr().err
    # a named profile with no finished cell
    assert main(["report", "--profile", "smoke", "--systems", "integro_de", "--out", str(out)]) == 1
    assert "0 of 9 cells of profile 'smoke' have finished runs" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("help_of", [None, "study", "benchmark", "tune"])
def test_cli_import_parser_and_help_load_no_heavy_module(help_of):
    show = (
        ""
        if help_of is None
        else f"p._subparsers._group_actions[0].choices[{help_of!r}].format_help(); "
    )
    code = (
        "import sys, flows.cli; p = flows.cli.build_parser(); "
        + show
        + "print(sorted(m for m in ('torch', 'mlflow', 'prefect', 'optuna', 'pandas') "
        "if m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_benchmark_command_and_exit_codes(
    mlflow_store, prefect_server, tmp_path, capsys, monkeypatch
):
    args = ["benchmark", "--profile", "smoke", "--systems", "integro_de", "--no-progress"]
    record = tmp_path / "results" / "smoke.json"
    assert main([*args, "--methods", "neural_laplace", "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert "1 cells: 1 finished, 0 reused, 0 failed" in out
    # --record: the finished cell from the store, and the command's counts
    from tasks.ledger.quick_record import read_quick_run

    run = read_quick_run(record)
    (cell,) = run.cells
    assert (run.profile, run.cells_trained, run.cells_reused) == ("smoke", 1, 0)
    assert (cell.system, cell.method, cell.epochs) == ("integro_de", "neural_laplace", 2)
    assert f"recorded 1 cells and {run.wall_seconds:.0f} s in {record}" in out
    assert "neural-laplace-integro_de version 1 is now @champion" in out
    assert "nllab ui" in out
    # an unknown model setting is a usage error before any work, naming the valid ones
    typo = tmp_path / "typo.toml"
    typo.write_text("[models.node]\nno_such_option = 1\n")
    assert main([*args, "--methods", "neural_laplace,node", "--config", str(typo)]) == 2
    err = capsys.readouterr().err
    assert "unknown node setting 'no_such_option'" in err and "augment_dim" in err
    # a value the model's constructor would refuse: a usage error before any work
    bad = tmp_path / "bad.toml"
    bad.write_text("[models.node]\naugment_dim = -1\n")
    assert main([*args, "--methods", "neural_laplace,node", "--config", str(bad)]) == 2
    assert "node setting 'augment_dim' must be at least 0, got -1" in capsys.readouterr().err
    # a failing cell (its model fails as it runs): exit 1 and a hint to re-run
    from nlmodels.baselines.ode import NODE

    def broken(self, *a, **k):
        raise RuntimeError("the vector field blew up")

    monkeypatch.setattr(NODE, "forward", broken)
    assert main([*args, "--methods", "neural_laplace,node"]) == 1
    out = capsys.readouterr().out
    assert "1 reused, 1 failed" in out and "run the same command again" in out
    # the report now finds the finished cell, with no flags: the latest benchmark's config
    assert main(["report", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nllab report: loading MLflow and reading the tracking store")
    assert "profile smoke" in out and "2 of 2 cells have finished runs" not in out
    assert "1 of 2 cells have finished runs" in out  # neural_laplace finished, node failed
    table = out.split("cells have finished runs")[0].splitlines()[:-1]
    assert "neural_laplace" in "".join(table) and max(len(line) for line in table) <= 100
    assert (
        main(
            [
                "report",
                "--profile",
                "smoke",
                "--systems",
                "integro_de",
                "--methods",
                "neural_laplace",
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    assert "1 of 1 cells have finished runs" in capsys.readouterr().out


def test_ui_binds_localhost_by_default():
    args = build_parser().parse_args(["ui"])
    assert args.host == "127.0.0.1"
    cmd, address = ui_command(args.host, args.port)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and address == "http://127.0.0.1:5000"
    assert cmd[cmd.index("--backend-store-uri") + 1].startswith("sqlite:///")
    assert Path(cmd[cmd.index("--default-artifact-root") + 1]).is_absolute()
    assert "--allowed-hosts" not in cmd
    cmd, _ = ui_command("0.0.0.0", 8080, "lab.example.org")
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert cmd[cmd.index("--allowed-hosts") + 1] == "lab.example.org"


def test_subcommands_of_other_modules_dispatch_through_main(capsys):
    assert main(["study", "nope", "--profile", "smoke"]) == 2
    assert "unknown study 'nope'" in capsys.readouterr().err
    assert main(["serve", "--check"]) == 0
    assert "benchmark-nightly" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    ["benchmark", "study stereographic", "tune --method node --system spiral_dde --trials 2"],
)
def test_epochs_and_budget_flags_reach_the_training_config(command):
    from flows.cli import build_parser
    from flows.cli.common import resolve, training_overrides

    argv = [*command.split(), "--epochs", "7", "--budget", "12.5"]
    args = build_parser().parse_args(argv)
    assert training_overrides(args) == {"epochs": 7, "max_train_seconds": 12.5}
    none = build_parser().parse_args([*command.split(), "--budget", "none"])
    assert training_overrides(none) == {"max_train_seconds": None}
    if command == "benchmark":
        assert resolve(none, "quick").training.max_train_seconds is None  # the cap is lifted
        assert resolve(args, "quick").training.max_train_seconds == 12.5


def test_budget_help_says_what_each_command_does_without_it(capsys):
    """The quick benchmark has no wall-clock budget (fixed epochs per model); quick studies
    cap each cell at 20 s (as the README says)."""
    from flows.studies._config import QUICK_TRAINING

    with pytest.raises(SystemExit):
        main(["benchmark", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: none; the quick profile trains each model its fixed epochs;" in text
    with pytest.raises(SystemExit):
        main(["study", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"quick profile: {QUICK_TRAINING['max_train_seconds']:g}, with 30 epochs" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            "benchmark --systems lotka",
            "unknown system 'lotka' (did you mean 'lotka_volterra_dde'?)",
        ),
        ("study stereografic", "unknown study 'stereografic'; valid studies: stereographic"),
        ("reproduce models:/nope@champion", "no registered model version at 'models:/nope@"),
        ("reproduce models:/nope", "names no version"),
        ("reproduce model.pt", "expected a model URI (models:/NAME@ALIAS, models:/NAME/VERSION"),
        (f"reproduce runs:/{'a' * 32}/model", "no run at 'runs:/aaaa"),
        (f"reproduce models:/m-{'a' * 32}", "no logged model at 'models:/m-aaaa"),
        ("reproduce models:/x@champion --ablation stereo", "unknown ablation 'stereo'"),
        ("benchmark --config missing.toml", "config file 'missing.toml' does not exist"),
        ("tune --method laplace --system sine --trials 2", "unknown method 'laplace'"),
        ("study noise --methods nod", "unknown method 'nod'"),
        ("serve --config missing.toml --check", "schedules file 'missing.toml' does not exist"),
        ("ledger run --ledger /dev/null/l.jsonl", "is below '/dev/null', a file; --ledger names"),
        ("ledger record --ledger .", "--ledger '.' is a folder; --ledger names the ledger file"),
        ("benchmark --record /dev/null/r.json", "is below '/dev/null', a file; --record names"),
        ("report --out /dev/null", "--out '/dev/null' is a file; --out names the folder"),
        ("benchmark --storage sqlite:///x.db", "--storage names where --tuned reads"),
        ("compare --against 0123abcd", "--against needs --run"),
    ],
)
def test_usage_errors_answer_before_the_heavy_stack_loads(argv, message, tmp_path):
    """Names, files and registry URIs are checked before torch, MLflow or Prefect load: exit 2,
    one line, none of them imported (what makes the answer fast, whatever the machine's load;
    the seconds themselves are a measurement, in the README, not a test)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NLLAB_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "flows.cli", *argv.split()]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    r = subprocess.run(
        [sys.executable, "-X", "importtime", *cmd[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    loaded = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert r.returncode == 2 and loaded, r.stderr
    assert not loaded & {"torch", "mlflow", "prefect", "optuna", "numpy"}
    assert not (tmp_path / "mlflow").exists()  # nothing created either


def test_registry_uri_check_reads_the_embedded_store(tmp_path, monkeypatch):
    """With no MLflow: a name, an alias and a version that exist pass; others are refused with
    the registered models listed."""
    import sqlite3

    from flows.cli.common import UsageError, check_registry_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))
    (tmp_path / "mlflow").mkdir()
    with sqlite3.connect(tmp_path / "mlflow" / "mlflow.db") as db:
        db.execute("create table registered_models (name text)")
        db.execute("create table model_versions (name text, version integer)")
        db.execute("create table registered_model_aliases (alias text, version int, name text)")
        db.execute("insert into registered_models values ('nl-x')")
        db.execute("insert into model_versions values ('nl-x', 1)")
        db.execute("insert into registered_model_aliases values ('champion', 1, 'nl-x')")
    check_registry_uri("models:/nl-x@champion")
    check_registry_uri("models:/nl-x/1")
    for uri in ("models:/nl-x@best", "models:/nl-x/2", "models:/nl-y@champion"):
        with pytest.raises(UsageError, match=r"registered models: nl-x$"):
            check_registry_uri(uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    check_registry_uri("models:/nl-y@champion")  # a server store answers later, through MLflow


def _list_options() -> list[tuple[str, str]]:
    """Each option of each subcommand that takes a list (read from the parser itself)."""
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (command, action.option_strings[-1])
        for command, parser in sub.choices.items()
        for action in parser._actions
        if action.option_strings and action.nargs in ("+", "*")
    ]


@pytest.mark.parametrize(("command", "option"), _list_options())
def test_every_list_option_refuses_a_value_that_names_nothing(command, option, capsys):
    """``--systems ''`` (an empty shell variable) or ``--seeds ,`` would select nothing, and a
    command would then say "nothing to do" or show an empty table: a usage error instead."""
    for value in ("", ",", ",,"):
        with pytest.raises(SystemExit) as e:
            main([command, option, value])
        assert e.value.code == 2
        assert f"argument {option}: expected a name or names" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    ["benchmark", "study stereographic", "tune --method node --system spiral_dde --trials 2"],
)
def test_runner_flags_reach_each_commands_execution_config(command, tmp_path):
    """``--reuse``, ``--no-pack`` and ``--checkpoints`` are each command's, not only the
    benchmark's (a study once parsed ``--reuse`` and dropped it)."""
    from flows.cli import build_parser
    from flows.cli.common import resolve
    from flows.cli.study import _config
    from flows.cli.tune import spec_from_args

    folder = str(tmp_path / "ck")
    argv = [*command.split(), "--reuse", "never", "--no-pack", "--checkpoints", folder]
    args = build_parser().parse_args(argv)
    if command == "benchmark":
        execution = resolve(args, "quick").execution
    elif command.startswith("study"):
        execution = _config(args).run.execution
    else:
        overrides = spec_from_args(args).overrides
        assert {k: overrides[k] for k in ("reuse", "pack", "checkpoints")} == {
            "reuse": "never", "pack": False, "checkpoints": folder,
        }  # fmt: skip
        return
    assert (execution.reuse, execution.pack, execution.checkpoints) == ("never", False, folder)


def test_a_checkpoints_folder_that_cannot_be_written_is_a_usage_error(tmp_path, capsys):
    afile = tmp_path / "a-file"
    afile.write_text("")
    assert main(["benchmark", "--profile", "smoke", "--checkpoints", str(afile)]) == 2
    assert f"--checkpoints {str(afile)!r} is a file" in capsys.readouterr().err
