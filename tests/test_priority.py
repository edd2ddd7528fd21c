"""Low priority against other sessions: the session's autogroup is raised only where the
session holds nothing but the run (and what started it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tasks.machine.priority import lower_session_group

ROOT = Path(__file__).resolve().parent.parent


def _proc(tmp_path: Path, processes: dict[int, tuple[str, int, int]], enabled: str = "1") -> Path:
    """A process table: pid → (name, parent pid, session id); each with an autogroup file."""
    proc = tmp_path / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/sched_autogroup_enabled").write_text(f"{enabled}\n")
    for pid, (name, ppid, session) in processes.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {session} 0 -1\n")
        (proc / str(pid) / "autogroup").write_text(f"/autogroup-{session} nice 0\n")
    (proc / "self").mkdir()  # entries that are not processes are skipped
    return proc


# a launching shell (the session's leader), the run, its worker; another session's process
SCRIPTED = {100: ("sh", 1, 100), 200: ("python (nllab) x", 100, 100), 201: ("w", 200, 100)}
OTHER_SESSION = {300: ("pytest", 1, 300)}


def test_a_session_of_its_own_has_its_group_lowered_and_then_restored(tmp_path):
    proc = _proc(tmp_path, SCRIPTED | OTHER_SESSION)
    change = lower_session_group(19, proc=proc, pid=200)
    assert (change.group, change.group_nice, change.group_before) == ("raised", 19, 0)
    assert (proc / "200/autogroup").read_text() == "19\n"
    assert change.hint() is None
    change.restore()  # a terminal's shell keeps the group after the run
    assert (proc / "200/autogroup").read_text() == "0\n"


def test_a_group_changed_by_somebody_else_meanwhile_is_not_restored(tmp_path):
    proc = _proc(tmp_path, SCRIPTED)
    change = lower_session_group(10, proc=proc, pid=200)
    (proc / "200/autogroup").write_text("/autogroup-100 nice 5\n")
    change.restore()
    assert (proc / "200/autogroup").read_text() == "/autogroup-100 nice 5\n"


def test_a_shared_session_keeps_its_group_and_says_so(tmp_path):
    # another job of the same terminal (not the run's ancestor or descendant)
    proc = _proc(tmp_path, SCRIPTED | OTHER_SESSION | {150: ("make test", 100, 100)})
    change = lower_session_group(19, proc=proc, pid=200)
    assert change.group == "shared"
    assert (proc / "200/autogroup").read_text() == "/autogroup-100 nice 0\n"
    assert "setsid" in change.hint()
    change.restore()  # nothing was raised: nothing to put back
    assert (proc / "200/autogroup").read_text() == "/autogroup-100 nice 0\n"


@pytest.mark.parametrize(("enabled", "nice"), [("0", 19), ("1", 0)])
def test_nothing_to_raise_without_autogroup_or_niceness(tmp_path, enabled, nice):
    proc = _proc(tmp_path, SCRIPTED, enabled=enabled)
    assert lower_session_group(nice, proc=proc, pid=200).group == "none"
    assert (proc / "200/autogroup").read_text() == "/autogroup-100 nice 0\n"


def test_the_group_is_raised_by_the_niceness_and_never_past_19(tmp_path):
    proc = _proc(tmp_path, SCRIPTED)
    (proc / "200/autogroup").write_text("/autogroup-100 nice 15\n")
    assert lower_session_group(10, proc=proc, pid=200).group_nice == 19


def test_a_process_in_the_default_group_competes_on_its_own_niceness(tmp_path):
    # the kernel leaves the autogroup file empty there: nothing to raise, nothing to hint
    proc = _proc(tmp_path, SCRIPTED | {150: ("make test", 100, 100)})
    for pid in SCRIPTED | {150: None}:
        (proc / str(pid) / "autogroup").write_text("")
    change = lower_session_group(19, proc=proc, pid=200)
    assert (change.group, change.hint()) == ("none", None)
    assert (proc / "200/autogroup").read_text() == ""


def _may_lower_niceness() -> bool:
    """Whether a process here may lower its niceness again (root, or ``CAP_SYS_NICE``)."""
    probe = "import os; os.nice(1); os.setpriority(os.PRIO_PROCESS, 0, 0)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_a_process_lowered_in_process_gets_its_niceness_back_where_allowed():
    """``ledger run`` called from Python (``flows.cli.main``) lowers its caller's priority for
    the run: the caller gets it back afterwards wherever the system lets a process lower its
    niceness, or keeps it (and nothing fails) where it does not."""
    probe = (
        "import os; from tasks.machine.priority import lower_priority; "
        "get = lambda: os.getpriority(os.PRIO_PROCESS, 0); base = get(); "
        "c = lower_priority(7); during = get(); c.restore(); print(base, during, get())"
    )
    child = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    base, during, after = map(int, child.stdout.split())
    assert during == min(19, base + 7) > base
    assert after == (base if _may_lower_niceness() else during)


def _autogroup_on() -> bool:
    try:
        on = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
        return on and Path("/proc/self/autogroup").exists()
    except OSError:
        return False


@pytest.mark.skipif(not _autogroup_on(), reason="no Linux autogroup scheduling here")
def test_on_this_kernel_a_run_in_its_own_session_lowers_its_group():
    probe = (
        "import os; from tasks.machine.priority import lower_priority; c = lower_priority(5); "
        "g = lambda: (open('/proc/self/autogroup').read().split() or ['default'])[-1]; "
        "lowered = g(); "
        "c.restore(); print(c.group, c.group_nice, os.getpriority(os.PRIO_PROCESS, 0), "
        "lowered, g())"
    )
    before = Path("/proc/self/autogroup").read_text()
    # in the default group (a session that never left init's: the file is empty) a process
    # competes on its own niceness, so nothing is raised and nothing is hinted
    shared = "shared" if before.split() else "none"
    # a sibling in this session, so that the child started in it never finds it its own
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for own_session, expected in ((True, "raised"), (False, shared)):
            child = subprocess.run(
                [sys.executable, "-c", probe],
                cwd=ROOT,
                capture_output=True,
                text=True,
                start_new_session=own_session,
            )
            assert child.returncode == 0, child.stderr
            out = child.stdout.split()
            assert out[0] == expected, out
            if own_session:  # the child's new group, then restored; its own niceness too
                assert int(out[1]) == int(out[3]) == 5
                assert int(out[2]) == (0 if _may_lower_niceness() else 5)
                assert int(out[4]) == 0
    finally:
        sibling.kill()
        sibling.wait()
    # the test's own session (shared with pytest and its workers) was left alone
    assert Path("/proc/self/autogroup").read_text() == before
