"""Where the numerics fingerprints are kept: beside the installation, so that a new home takes
those another home of the installation computed (its first ``nllab ledger status``, ``benchmark``
or ``doctor`` trains no canary), under a key of the code, the machine and the environment, so
that another machine or environment computes its own; in the home where the installation's
folder cannot be used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import nlmodels._cpu
import nltrain.numerics
from datasets import installation_cache
from nltrain.numerics import _fingerprints as fingerprints


def _no_canary(*args: object) -> str:
    raise RuntimeError("a canary ran")


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``home(name)``: switch to a fresh home ``name`` (this process's memo forgotten, as a new
    process's) beside one installation cache, ``tmp_path / "installation"``."""
    monkeypatch.setenv("NLLAB_INSTALL_CACHE", str(tmp_path / "installation"))

    def home(name: str) -> Path:
        monkeypatch.setenv("NLLAB_HOME", str(tmp_path / name))
        monkeypatch.setattr(fingerprints, "_MEMO", {})
        return tmp_path / name

    return home


def _both() -> tuple[str, str]:
    return nltrain.numerics.model_fingerprint("node", None, 1), nltrain.numerics.system_fingerprint(
        "integro_de"
    )


def test_a_fresh_home_takes_the_installations_fingerprints_without_running_a_canary(
    homes, tmp_path, monkeypatch
):
    first = homes("first")
    computed = _both()
    assert not any(fp.startswith("failed-") for fp in computed)
    kept = sorted(p.name for p in (tmp_path / "installation" / "numerics").iterdir())
    assert [name.split("-")[0] for name in kept] == ["model", "system"]
    assert not (first / "numerics").exists()  # nothing of them in the home
    homes("second")
    monkeypatch.setattr(fingerprints, "_model_canary", _no_canary)
    monkeypatch.setattr(fingerprints, "_system_canary", _no_canary)
    assert _both() == computed


def test_canaries_that_only_split_one_data_set_otherwise_simulate_it_once(homes, monkeypatch):
    import datasets
    from nltrain.numerics import canary_split

    homes("first")
    monkeypatch.setattr(fingerprints, "_SIMULATED", {})
    simulated = []
    simulate = datasets.simulate

    def counted(system, *args, **kwargs):
        simulated.append(system)
        return simulate(system, *args, **kwargs)

    monkeypatch.setattr(datasets, "simulate", counted)
    splits = [{"n_observed": 5}, {"n_observed": 10}]  # a split keyword: one data set, split twice
    split_twice = [nltrain.numerics.system_fingerprint("integro_de", s) for s in splits]
    assert simulated == ["integro_de"] and len(set(split_twice)) == 2
    nltrain.numerics.system_fingerprint("integro_de", {"noise_std": 0.05})  # simulated otherwise
    assert simulated == ["integro_de"] * 2
    # each the fingerprint of a canary that simulates its data set itself
    assert split_twice == [
        fingerprints._system_canary("integro_de", canary_split(s)) for s in splits
    ]
    assert simulated == ["integro_de"] * 4


@pytest.mark.parametrize("change", ["machine", "environment"])
def test_another_machine_or_environment_does_not_take_them(change, homes, monkeypatch):
    """The canary is faked (its bytes are not the point): the key is."""
    homes("first")
    monkeypatch.setattr(fingerprints, "_model_canary", lambda *a: "0123456789abcdef")
    assert nltrain.numerics.model_fingerprint("node", None, 1) == "0123456789abcdef"
    homes("second")
    if change == "machine":  # another CPU's flags
        monkeypatch.setattr(nlmodels._cpu, "cpu_features", lambda: "flags\t\t: fpu sse2")
    else:  # a variable that can move the bytes
        monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setattr(fingerprints, "_model_canary", _no_canary)
    assert nltrain.numerics.model_fingerprint("node", None, 1).startswith("failed-")


def test_a_record_of_another_whole_key_is_not_taken(homes, monkeypatch):
    """The file name holds a prefix of the key; the record holds it whole."""
    homes("first")
    monkeypatch.setattr(fingerprints, "_model_canary", lambda *a: "0123456789abcdef")
    nltrain.numerics.model_fingerprint("node", None, 1)
    (kept,) = installation_cache("numerics").iterdir()
    kept.write_text(kept.read_text().replace('"key": "', '"key": "0'))
    homes("second")
    monkeypatch.setattr(fingerprints, "_model_canary", _no_canary)
    assert nltrain.numerics.model_fingerprint("node", None, 1).startswith("failed-")


def test_a_fresh_home_takes_the_machines_pinned_check(homes, monkeypatch):
    """``nllab doctor``'s check of this machine's bytes against the pins (what runs are
    tagged with), made once for the installation."""
    from nltrain.numerics import _pinned

    homes("first")
    monkeypatch.setattr(_pinned, "pinned_mismatches", lambda: [])
    check, computed = nltrain.numerics.check_pinned()
    assert computed and check.verdict == "as pinned"
    homes("second")
    monkeypatch.setattr(_pinned, "pinned_mismatches", _no_canary)
    assert nltrain.numerics.last_pinned_check() == check
    assert nltrain.numerics.check_pinned() == (check, False)


@pytest.mark.parametrize("why", ["a file is in the way", "others can write it"])
def test_where_the_installations_folder_cannot_be_used_the_home_keeps_them(
    why, tmp_path, monkeypatch
):
    place = tmp_path / "installation"
    if why == "a file is in the way":
        place.write_text("")
    else:
        (place / "numerics").mkdir(parents=True)
        os.chmod(place / "numerics", 0o777)
    monkeypatch.setenv("NLLAB_INSTALL_CACHE", str(place))
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(fingerprints, "_MEMO", {})
    assert installation_cache("numerics") is None
    monkeypatch.setattr(fingerprints, "_model_canary", lambda *a: "0123456789abcdef")
    nltrain.numerics.model_fingerprint("node", None, 1)
    assert len(list((tmp_path / "home" / "numerics").iterdir())) == 1


def test_where_the_installations_folder_cannot_be_written_the_home_keeps_them(homes, monkeypatch):
    """A record that cannot be written there (here: a folder in the way of its file) is kept
    in the home, and read from there by the next process."""
    home = homes("first")
    folder = installation_cache("numerics")
    key = fingerprints.source_key("node")
    (folder / f"model-node-1d-{key[:24]}.json").mkdir()
    monkeypatch.setattr(fingerprints, "_model_canary", lambda *a: "0123456789abcdef")
    assert nltrain.numerics.model_fingerprint("node", None, 1) == "0123456789abcdef"
    assert len(list((home / "numerics").iterdir())) == 1
    monkeypatch.setattr(fingerprints, "_MEMO", {})
    monkeypatch.setattr(fingerprints, "_model_canary", _no_canary)
    assert nltrain.numerics.model_fingerprint("node", None, 1) == "0123456789abcdef"


def test_a_source_key_reads_files_again_only_when_their_stamps_changed(tmp_path, monkeypatch):
    """A key is kept with its files' stamps only when each file changed over a second before
    (an edit of the same size within the file system's timestamp resolution would keep its
    stamp): a file edited at once, to the same size, is read again."""
    module = tmp_path / "toy_stamps.py"
    module.write_text("X = 1\n")
    monkeypatch.setattr(fingerprints, "_KEYS", {})
    monkeypatch.setattr(fingerprints, "covered_sources", lambda method=None: {"toy": module})
    before = fingerprints.source_key()
    module.write_text("X = 2\n")  # the same size, at once
    edited = fingerprints.source_key()
    assert edited != before and fingerprints._KEYS == {}  # neither was kept
    monkeypatch.setattr(fingerprints, "_SETTLED_NS", -(10**10))  # as if changed long ago
    assert fingerprints.source_key() == edited
    assert fingerprints._KEYS[None][2] == edited  # kept: not read again while unchanged
    module.write_text("X = 30\n")
    assert fingerprints.source_key() not in (edited, before)
