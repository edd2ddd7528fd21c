"""Schedules: the default file builds deployments with its cron schedules; malformed entries
are errors naming the entry; serving without a Prefect server explains how to get one."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from terminal import takes_ctrl_c

from flows.cli import main
from flows.runtime.prefect_server import ServerMissing, require_server
from flows.serve.deployments import (
    DEFAULT_SCHEDULES,
    ScheduleError,
    build_deployments,
    load_schedules,
)

ROOT = Path(__file__).resolve().parents[1]


def test_default_schedules_become_deployments_with_their_crons():
    raw = tomllib.loads(DEFAULT_SCHEDULES.read_text())["schedule"]
    deployments = build_deployments(load_schedules())
    assert [d.name for d in deployments] == [e["name"] for e in raw]
    for d, e in zip(deployments, raw):
        (schedule,) = d.schedules
        assert schedule.schedule.cron == e["cron"]
        assert schedule.schedule.timezone == "UTC"
    nightly = deployments[0]
    assert nightly.entrypoint.endswith("flows/serve/deployments.py:scheduled_benchmark")
    assert nightly.parameters == {"profile": "smoke", "config": {}}
    study = deployments[1].parameters["study"]
    assert study["method"] == "neural_laplace" and study["n_trials"] == raw[1]["trials"]
    assert any(e["flow"] == "tune" for e in raw) and raw[0]["profile"] == "smoke"
    studies = [d for d, e in zip(deployments, raw) if e["flow"] == "study"]
    assert studies and all(d.entrypoint.endswith(":scheduled_study") for d in studies)
    assert {d.parameters["study"] for d in studies} <= {"stereographic", "noise"}


def _write(tmp_path, body: str):
    p = tmp_path / "schedules.toml"
    p.write_text(body)
    return p


GOOD = 'name = "b"\nflow = "benchmark"\ncron = "0 2 * * *"\n'


@pytest.mark.parametrize(
    "body, match",
    [
        (
            '[[schedule]]\nname = "bad-cron"\nflow = "benchmark"\ncron = "61 * * * *"\n',
            r"entry 1 \('bad-cron'\): cron: invalid cron string '61 \* \* \* \*'",
        ),
        (
            f'[[schedule]]\n{GOOD}\n[[schedule]]\nname = "t"\nflow = "tune"\ncron = "0 3 * * 0"\n'
            'method = "node"\nsystem = "nowhere"\ntrials = 3\n',
            r"(?s)entry 2 \('t'\): .*unknown system 'nowhere'",
        ),
        (
            '[[schedule]]\nname = "x"\nflow = "train"\ncron = "0 2 * * *"\n',
            r"entry 1 \('x'\): flow must be one of 'benchmark', 'tune', 'study'",
        ),
        (f'[[schedule]]\n{GOOD}timezone = "Mars/Olympus"\n', r"entry 1 \('b'\): timezone"),
        (f'[[schedule]]\n{GOOD}colour = "red"\n', r"entry 1 \('b'\): colour: unknown setting"),
        (f"[[schedule]]\n{GOOD}\n[[schedule]]\n{GOOD}", r"entry 2 \('b'\): duplicate name"),
        (f'[[schedule]]\n{GOOD}config = {{ epochs = "many" }}\n', r"entry 1 \('b'\)"),
        (
            '[[schedule]]\nname = "s"\nflow = "study"\ncron = "0 4 * * 6"\nstudy = "astrology"\n',
            r"entry 1 \('s'\): unknown study 'astrology'",
        ),
        (
            f"[[schedule]]\n{GOOD}config = {{ models = {{ neural_laplace = "
            "{ stereographic = false, max_frequency = 2.0 } } }\n",
            r"entry 1 \('b'\): neural_laplace on .*max_frequency",
        ),
        ("", "no \\[\\[schedule\\]\\] entries"),
        ("[[schedule]\n", "not valid TOML"),
    ],
)
def test_malformed_schedule_is_an_error_naming_the_entry(tmp_path, body, match):
    with pytest.raises(ScheduleError, match=match):
        load_schedules(_write(tmp_path, body))


def test_no_server_explains_how_to_start_one(tmp_path, capsys, monkeypatch):
    with pytest.raises(ServerMissing, match="prefect server start"):
        require_server(None)
    assert require_server("http://127.0.0.1:4200/api") == "http://127.0.0.1:4200/api"
    monkeypatch.setattr("flows.runtime.prefect_server.api_url", lambda: None)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "PREFECT_API_URL" in err and "--start-server" in err
    assert main(["serve", "--check"]) == 0
    assert "benchmark-nightly" in capsys.readouterr().out
    bad = _write(tmp_path, '[[schedule]]\nname = "z"\nflow = "benchmark"\ncron = "bad"\n')
    assert main(["serve", "--config", str(bad)]) == 2


def _check_in_a_fresh_process(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """``nllab serve --check`` in a new interpreter, and which heavy packages it loaded."""
    code = (
        "import sys\nfrom flows.cli import main\nrc = main(sys.argv[1:])\n"
        "print(sorted(m for m in ('torch', 'mlflow', 'optuna') if m in sys.modules), "
        "file=sys.stderr)\nraise SystemExit(rc)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "serve", "--check", *args],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NLLAB_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    *_, loaded = r.stderr.strip().splitlines()
    return r, loaded


def test_serve_check_validates_every_entry_without_torch_mlflow_or_optuna(tmp_path):
    r, loaded = _check_in_a_fresh_process(tmp_path)
    assert r.returncode == 0, r.stderr
    names = [e["name"] for e in tomllib.loads(DEFAULT_SCHEDULES.read_text())["schedule"]]
    assert [line.split()[0] for line in r.stdout.splitlines()] == names
    assert loaded == "[]"
    # A bad entry behind good ones of every flow is still refused, on the same light path.
    tune = 'flow = "tune"\ncron = "0 3 * * 0"\nmethod = "node"\nsystem = "sine"\n'
    study = 'flow = "study"\ncron = "0 4 * * 6"\nstudy = "noise"\nsystems = ["nowhere"]\n'
    body = (
        f'[[schedule]]\n{GOOD}\n[[schedule]]\nname = "t"\n{tune}\n[[schedule]]\nname = "s"\n{study}'
    )
    r, loaded = _check_in_a_fresh_process(tmp_path, "--config", str(_write(tmp_path, body)))
    assert r.returncode == 2
    assert "entry 3 ('s')" in r.stderr and "unknown system 'nowhere'" in r.stderr
    assert loaded == "[]"


def test_instances_on_one_server_pause_only_what_no_other_serves(prefect_server, monkeypatch):
    from prefect.client.orchestration import get_client

    import flows.serve.serve_loop as serve

    deployments = build_deployments(load_schedules())[:2]
    ids = [d.apply() for d in deployments]
    names = [f"{d.flow_name}/{d.name}" for d in deployments]
    first, second = serve.ServeLease("http://x/api", names), serve.ServeLease("http://x/api", names)
    first.beat()
    second.beat()
    assert first.served_by_others() == set(names) == second.served_by_others()
    assert first.release() == []  # the second still serves them: nothing to pause
    assert second.served_by_others() == set()
    alone = second.release()
    assert alone == sorted(names)
    serve.pause_deployments(alone)
    with get_client(sync_client=True) as client:
        assert all(client.read_deployment(i).paused for i in ids)
    # an instance that died without cleaning up stops counting once its beat is stale
    ghost, me = serve.ServeLease("http://x/api", names), serve.ServeLease("http://x/api", names)
    ghost.beat()
    assert me.served_by_others() == set(names)
    monkeypatch.setattr(serve.time, "time", lambda: 10**10)
    assert me.served_by_others() == set() and me.release() == sorted(names)


def test_a_serve_whose_server_stops_answering_is_told_to_stop(monkeypatch):
    import threading
    import time

    import flows.serve.serve_loop as serve

    up = threading.Event()
    up.set()
    monkeypatch.setattr(serve, "healthy", lambda url, timeout=2.0: up.is_set())
    monkeypatch.setattr(serve.ServeLease, "beat", lambda self: None)
    lost = threading.Event()
    lease = serve.ServeLease("http://127.0.0.1:9/api", ["f/d"])
    thread = lease.watch(lost.set, every=0.05)
    time.sleep(0.3)
    assert not lost.is_set() and not lease.server_lost.is_set()  # healthy: keeps serving
    up.clear()
    # a few missed beats of 0.05 s; the ceilings only bound a wait that ends as soon as they are
    # missed (seconds of a loaded machine's scheduling are not the failure looked for)
    assert lost.wait(60) and lease.server_lost.is_set()
    thread.join(60)
    assert not thread.is_alive()


# -- as a user meets it: a bad port, a dead server, a slow start, Ctrl-C ---------------------------
def _nllab(home, *args: str, **env: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    full = {**os.environ, "PYTHONPATH": str(root), "NLLAB_HOME": str(home), **env}
    for var in ("MLFLOW_TRACKING_URI", "PREFECT_HOME", *(() if env else ("PREFECT_API_URL",))):
        full.pop(var, None)
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # a terminal's job takes Ctrl-C, even where this test runs as a shell's `&` job
        preexec_fn=takes_ctrl_c,
    )


@pytest.mark.parametrize("command", ["ui", "serve"])
@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_a_port_outside_1_to_65535_is_a_usage_error(tmp_path, command, port):
    p = _nllab(tmp_path, command, "--port", port)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "a TCP port from 1 to 65535" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {"PREFECT_API_URL": "http://127.0.0.1:9/api"}, "no Prefect server answers at"),
        (
            ["--start-server", "--port", "4399"],
            {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1"},
            "did not start within 1 s",
        ),
    ],
)
def test_a_server_that_does_not_answer_is_one_line_and_exit_3(tmp_path, args, env, expected):
    p = _nllab(tmp_path, "serve", *args, **env)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, out + err
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    if "start-server" in args:
        assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=SECONDS" in err


@pytest.mark.slow
def test_ctrl_c_of_serve_start_server_pauses_stops_and_exits_130(tmp_path):
    import os
    import signal

    from flows.runtime.prefect_server import healthy

    p = _nllab(tmp_path, "serve", "--start-server", "--port", "4398")
    for line in p.stdout:
        if line.startswith("to trigger"):
            break
    # as Ctrl-C in a terminal (the whole foreground group), while serving starts
    os.killpg(p.pid, signal.SIGINT)
    try:
        out, err = p.communicate(timeout=120)
    finally:  # a command that ignored the Ctrl-C does not outlive the test
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, out + err
    assert "Traceback" not in err and "ConnectError" not in err
    assert "nllab serve: interrupted; paused" in err
    assert not healthy("http://127.0.0.1:4398/api")  # the server it started is stopped


def _entry_fields() -> list[tuple[str, str]]:
    """Each key of each kind of schedule entry, as the file names it (read from the types)."""
    from flows.serve._schedules import _SPEC_NAMES, BenchmarkEntry, StudyEntry, _Entry
    from tasks.tuning import TuneSpec

    in_file = {field: key for key, field in _SPEC_NAMES.items()}
    return (
        [("benchmark", f) for f in BenchmarkEntry.model_fields if f != "flow"]
        + [("tune", f) for f in _Entry.model_fields]
        + [("tune", in_file.get(f, f)) for f in TuneSpec.model_fields]
        + [("study", f) for f in StudyEntry.model_fields if f != "flow"]
    )


_ENTRY = {
    "benchmark": {"name": "b", "flow": "benchmark", "cron": "0 2 * * *", "profile": "smoke"},
    "tune": {"name": "t", "flow": "tune", "cron": "0 3 * * 0", "method": "node",
             "system": "integro_de", "trials": 2},
    "study": {"name": "s", "flow": "study", "cron": "0 4 * * 6", "study": "stereographic"},
}  # fmt: skip
#: Values no schedule was written for; each goes into a TOML file as TOML writes it.
_ABSURD = ("-1", "0", "1000000000000", "inf", "nan", "-1.5", '"bogus"', '""', '"/dev/null/x"',
           '"sqlite:///:memory:"', "true", "[1]", "{ a = 1 }")  # fmt: skip


@pytest.mark.parametrize(("kind", "key"), _entry_fields())
def test_any_value_of_any_schedule_key_is_refused_when_loaded_or_runs(
    kind, key, tmp_path, monkeypatch
):
    """A schedule is refused when the file is loaded, naming the key, or it becomes a
    deployment whose first steps work (a tuning study opens its storage and its sampler):
    never an entry that loads and then fails at its first run, at night."""
    from tasks.tuning.storage import open_storage, open_study

    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    for value in _ABSURD:
        entry = {**_ENTRY[kind]}
        entry.pop(key, None)
        lines = [f"{k} = {v!r}".replace("'", '"') for k, v in entry.items()]
        body = "[[schedule]]\n" + "\n".join([*lines, f"{key} = {value}"]) + "\n"
        try:
            (loaded,) = load_schedules(_write(tmp_path, body))
        except ScheduleError as e:
            said = str(e)
            named = key in said or key.replace("_", " ") in said or "unknown setting" in said
            assert named, (key, value, said)
            continue
        (deployment,) = build_deployments([loaded])
        assert deployment.name == loaded.name
        if kind == "tune":
            spec = loaded.spec
            storage = open_storage(
                spec.storage,
                heartbeat_seconds=spec.heartbeat_seconds,
                grace_seconds=spec.grace_seconds,
            )
            assert open_study(spec, storage, epochs=10).study_name == spec.study_name
            if spec.dask_address:
                from flows.runtime._dask import DaskUnreachable, dask_task_runner

                try:  # its form: the file's; whether a scheduler listens: the night's
                    dask_task_runner(1, spec.dask_address)
                except DaskUnreachable:
                    pass
