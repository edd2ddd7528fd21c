"""The training loop keeps the objects it finds out of Python's cyclic collector while it trains,
and hands the collector back as it found it."""

from __future__ import annotations

import gc
import threading

import pytest

from nltrain._collector import collector_frozen


@pytest.fixture(autouse=True)
def _unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_objects_alive_at_the_start_are_frozen_for_the_block_only():
    before = object()
    tracked = [before]  # a container, so that the collector tracks it
    with collector_frozen():
        assert gc.get_freeze_count() > 0
        assert not any(o is tracked for o in gc.get_objects())  # frozen: not in any generation
        made = [object()]
        assert any(o is made for o in gc.get_objects())  # the block's own are collected as ever
    assert gc.get_freeze_count() == 0
    assert any(o is tracked for o in gc.get_objects())


def test_a_cycle_made_inside_the_block_is_collected_inside_it():
    with collector_frozen():
        cycle: list = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1


def test_nested_and_concurrent_blocks_unfreeze_once_the_last_ends():
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_frozen():
            inside.set()
            release.wait(10)

    with collector_frozen():
        worker = threading.Thread(target=other)
        worker.start()
        assert inside.wait(10)
        with collector_frozen():
            pass
        assert gc.get_freeze_count() > 0  # the nested block ended, two still run
    assert gc.get_freeze_count() > 0  # the thread's block still runs
    release.set()
    worker.join(10)
    assert gc.get_freeze_count() == 0


def test_a_collector_frozen_by_someone_else_is_left_as_it_is():
    gc.freeze()
    count = gc.get_freeze_count()
    with collector_frozen():
        pass
    assert gc.get_freeze_count() == count


def test_the_training_loop_trains_with_the_collector_frozen(monkeypatch):
    import nltrain._loop as loop

    seen = []
    monkeypatch.setattr(loop, "_train_cells", lambda *a: seen.append(gc.get_freeze_count()) or [])
    assert loop.train_loop(object(), object()) == []  # type: ignore[arg-type]
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0
