"""Stored runs are found again by their cell's config hash: every profile's cells must keep the
hash (and the MLflow run name) they had when the fixture was written, whatever the code's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.config import PROFILES, resolve_config
from tasks.tracking import run_name

RECORDED = json.loads((Path(__file__).parent / "data" / "profile_cells.json").read_text())


@pytest.mark.parametrize("profile", PROFILES)
def test_every_cell_of_a_profile_keeps_its_config_hash_and_run_name(profile: str) -> None:
    cells = resolve_config(profile).cells()
    now = {c.key: {"config_hash": c.config_hash(), "run_name": run_name(c)} for c in cells}
    assert now == RECORDED[profile]
