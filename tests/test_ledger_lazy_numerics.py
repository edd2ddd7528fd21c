"""A scope computes today's numerics only for the cells its ledger holds records of: a cell
without a record is missing whatever its numerics are, so its canary (most of a new code
state's cost: the studies' and the peers') waits until a record of it asks. What was computed
stays cached, a later call computes only what it lacks, and the states are those of the scope
with every cell's numerics."""

from __future__ import annotations

from pathlib import Path

import pytest
from cells import ledger_record

import tasks.ledger.scope as scope_module
from tasks.ledger import append_records, read_ledger
from tasks.ledger.scope import ledger_scope, scope_of
from tasks.ledger.views import cell_states


def _fingerprint(cell) -> str:
    return f"fp-{cell.method}-{cell.system}-{cell.seed}"


@pytest.fixture
def canaries(tmp_path, monkeypatch) -> list[str]:
    """The config hashes whose canaries ran, in order (a stand-in that fingerprints a cell by
    its method, system and seed), on an installation cache of its own."""
    monkeypatch.setenv("NLLAB_INSTALL_CACHE", str(tmp_path / "installation"))
    ran: list[str] = []

    def numerics(cell) -> str:
        ran.append(cell.config_hash())
        return _fingerprint(cell)

    monkeypatch.setattr(scope_module, "cell_numerics", numerics)
    return ran


def _ledger_of(path: Path, *cells) -> Path:
    """A ledger at ``path`` holding one record of each of ``cells`` (by today's numerics)."""
    append_records(path, [_record(c, _fingerprint(c)) for c in cells])
    return path


def _record(cell, numerics: str, **kw):
    return ledger_record(
        cell.system, cell.method, cell.seed, config_hash=cell.config_hash, numerics=numerics, **kw
    )


def test_only_the_recorded_cells_numerics_are_computed_and_the_rest_when_asked(canaries, tmp_path):
    every = scope_of(numerics=_fingerprint)  # the profile's own systems and methods: one scope
    cells = list({c.config_hash: c for c in every.cells}.values())  # one per config
    assert len(cells) > 4

    nothing = ledger_scope(ledger=tmp_path / "absent.jsonl")
    assert canaries == [] and {c.numerics for c in nothing.cells} == {None}
    assert [c.config_hash for c in nothing.cells] == [c.config_hash for c in every.cells]

    one = _ledger_of(tmp_path / "one.jsonl", cells[3])
    first = ledger_scope(ledger=one)
    assert canaries == [cells[3].config_hash]
    for c in first.cells:
        assert c.numerics == (_fingerprint(c) if c.config_hash == cells[3].config_hash else None)
    assert ledger_scope(ledger=one) == first and len(canaries) == 1  # read from the cache

    two = _ledger_of(tmp_path / "two.jsonl", cells[3], cells[0])
    second = ledger_scope(ledger=two)
    assert canaries == [cells[3].config_hash, cells[0].config_hash]  # the one it lacked, once
    assert {c.config_hash for c in second.cells if c.numerics} == {
        cells[0].config_hash,
        cells[3].config_hash,
    }

    assert ledger_scope() == every  # no ledger: every cell's, each canary once
    assert sorted(canaries) == sorted(c.config_hash for c in cells)
    assert ledger_scope(ledger=two) == every and len(canaries) == len(cells)


def test_a_lazy_scope_judges_the_ledgers_records_as_the_whole_one_does(canaries, tmp_path):
    """Records by today's numerics, by older ones and of another config: the same states as
    with every cell's numerics computed, from the canaries of the recorded cells alone."""
    every = scope_of(numerics=_fingerprint)
    node = every.select(["integro_de"], ["node"])
    laplace = every.select(["integro_de"], ["neural_laplace"])
    ledger = tmp_path / "ledger.jsonl"
    records = [
        _record(node[0], _fingerprint(node[0])),
        _record(node[1], "fp-of-another-cpu"),
        _record(laplace[2], _fingerprint(laplace[2])),
    ]
    records.append(ledger_record("integro_de", "node", node[3].seed, config_hash="x" * 64))
    append_records(ledger, records)

    scope = ledger_scope(ledger=ledger)
    read = read_ledger(ledger, scope)
    assert sorted(canaries) == sorted(
        {node[0].config_hash, node[1].config_hash, laplace[2].config_hash}
    )
    lazy = cell_states(read, scope.select(ablations=None))
    whole = cell_states(read, every.select(ablations=None))
    assert [(s.cell.key, s.state, s.numerics) for s in lazy] == [
        (s.cell.key, s.state, s.numerics) for s in whole
    ]
    said = {s.cell.key: (s.state, s.numerics) for s in lazy}
    assert said[node[0].key] == ("recorded", "today")
    assert said[node[1].key] == ("recorded", "older")
    assert said[node[3].key] == ("other_config", "")
