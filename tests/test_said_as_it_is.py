"""What a command says is what happened: a simulator that leaves by ``sys.exit`` is user code
failing (exit 1, as documented), not a setting to change (2); cells retrained because the CPU
numerics mode changed are not said to be retrained because their model's code changed."""

from __future__ import annotations

import pytest
from cells import tiny_cell

from flows.cli import main
from nltrain.numerics import FINGERPRINT_FORMAT
from tasks.machine.numerics import CellNumerics, model_key, stale, system_key
from tasks.tracking import RunRecord, RunTags

SIMULATOR = """
import sys

def exits_at_once(n, seed):
    sys.exit(0)
"""


@pytest.mark.parametrize("command", ["systems", "benchmark"])
def test_a_simulator_leaving_by_sys_exit_as_it_is_declared_exits_1_naming_it(
    command, tmp_path, monkeypatch, capsys, forget_declared_systems
):
    (tmp_path / "exiting_sims.py").write_text(SIMULATOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    config = tmp_path / "c.toml"
    config.write_text(
        'systems = ["s"]\nmethods = ["node"]\n'
        '[define_systems.s]\nsimulator = "exiting_sims:exits_at_once"\n'
    )
    assert main([command, "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"nllab {command}: error: simulator 'exiting_sims:exits_at_once' called sys.exit(0)"
    )


def _stale_lines(cpu: str) -> list[str]:
    """What ``stale`` says of a NODE cell whose model fingerprint is not today's, trained by
    commit ``abcdef1`` in the CPU numerics ``cpu``."""
    cell = tiny_cell()
    today = CellNumerics({model_key(cell): "m" * 16}, {system_key(cell): "s" * 16})
    tags = {
        RunTags.NUMERICS_MODEL: "0" * 16,
        RunTags.NUMERICS_SYSTEM: "s" * 16,
        RunTags.NUMERICS_FORMAT: FINGERPRINT_FORMAT,
        RunTags.GIT_COMMIT: "abcdef123456",
        RunTags.CPU_NUMERICS: cpu,
    }
    record = RunRecord("run-1", cell.config_hash(), 0.5, tags)
    retrained, lines = stale([cell], {cell.config_hash(): record}, today)
    assert retrained == {cell.config_hash()}
    return lines


def test_cells_of_another_numerics_mode_are_said_retrained_for_the_mode_not_the_code():
    import nlmodels

    here = nlmodels.cpu_mode_in_effect()
    assert _stale_lines(here) == ["node changed since commit abcdef1: 1 cell retrained"]
    (line,) = _stale_lines("native (AVX512)")
    assert "changed since commit" not in line
    assert line == (
        f"1 finished cell trained in other CPU numerics (native (AVX512); now {here}) "
        "retrained: the numerics changed, not the code"
    )
