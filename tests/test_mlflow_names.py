"""Every method and system name reaches MLflow's names through one reversible mapping: each
token passes MLflow's own validators (registered and logged model names, metric and tag keys),
decodes back to its name, and two names never share a token or a registered model; the
built-in names are their own tokens (the pinned run names and registered names stand)."""

from __future__ import annotations

import random

import pytest
from mlflow.utils.validation import (
    _validate_logged_model_name,
    _validate_model_name,
    _validate_tag_name,
)

from tasks.config import METHODS, SYSTEM_NAMES, ConfigError, resolve_config
from tasks.config.mlflow_names import (
    MAX_TOKEN,
    logged_model_name,
    name_problem,
    name_token,
    registered_model_name,
    split_registered_name,
    token_name,
)

HOSTILE = [
    "pkg.mod:Class",
    "tinymlp:TinyMLP",
    "a/b",
    "../../etc",
    "/abs",
    ".",
    "..",
    "a b",
    " lead",
    "trail ",
    "%41",
    "%",
    "'quoted'",
    '"dq"',
    "-",
    "--",
    "a-2Db",  # looks like an escape
    "-2D",
    "neural-laplace",
    "neural_laplace-x",
    "A",
    "AB",
    "0node",
    "Fab",
    "m-0123456789abcdef0123456789abcdef",
    "models:/x@champion",
    "é",
    "日本語モデル",
    "🙂",
    "tab\tnew\nline",
    "nul\x00",
    "\ud800",  # a lone surrogate
    "x" * 120,
]
SYSTEMS = ["integro_de", "pendulum_lab", "AB", "3d", "s-1", "日本", "a:b"]


def _mlflow_accepts(method: str, system: str) -> None:
    _validate_model_name(registered_model_name(method, system))
    _validate_logged_model_name(logged_model_name(method, system, 0))
    _validate_tag_name(name_token(method))  # also usable as a tag or metric key


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_name_round_trips_and_passes_mlflow_s_rules(name: str) -> None:
    token = name_token(name)
    assert token_name(token) == name
    for system in SYSTEMS:
        _mlflow_accepts(name, system)
        assert split_registered_name(registered_model_name(name, system)) == (name, system)


def _generated(rng: random.Random, n: int) -> list[str]:
    alphabet = (
        "abcAZF09_-.:/%@ '\"\\é日🙂\t"
        + "".join(chr(c) for c in range(0x20, 0x7F))
        + "".join(chr(rng.randrange(0xA0, 0x2FFFF)) for _ in range(200))
    )
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def test_generated_names_are_distinct_tokens_and_distinct_registered_models() -> None:
    rng = random.Random(0)
    names = sorted(set(_generated(rng, 3000)) | set(HOSTILE))
    tokens = {name_token(n): n for n in names}
    assert len(tokens) == len(names)  # no two names share a token
    assert all(token_name(t) == n for t, n in tokens.items())
    pairs = [(m, s) for m in names[:70] + list(METHODS) for s in names[-40:] + SYSTEMS]
    registered = {registered_model_name(m, s): (m, s) for m, s in pairs}
    assert len(registered) == len(set(pairs))  # no two (method, system) share a champion
    for name, pair in registered.items():
        assert split_registered_name(name) == pair
        _validate_model_name(name)
        _validate_logged_model_name(logged_model_name(*pair, 3))


def test_built_in_names_are_their_own_tokens_and_keep_their_registered_names() -> None:
    for name in (*METHODS, *SYSTEM_NAMES):
        assert name_token(name) == name
    assert registered_model_name("neural_laplace", "integro_de") == "neural-laplace-integro_de"
    assert registered_model_name("node", "integro_de") == "node-integro_de"
    assert registered_model_name("pkg.mod:Class", "sine") == "pkg-2Emod-3AClass-sine"
    assert logged_model_name("latent_ode", "sine", 2) == "latent_ode-sine-s2"


def test_a_name_too_long_for_mlflow_is_refused_in_one_line() -> None:
    assert name_problem("method", "x" * MAX_TOKEN) is None
    assert "at most 120" in (name_problem("method", "x" * (MAX_TOKEN + 1)) or "")
    assert "at most 120" in (name_problem("method", "é" * 21) or "")  # 126 once escaped
    with pytest.raises(ConfigError, match=r"methods: method name .* too long for MLflow"):
        resolve_config("smoke", overrides={"methods": ["m" * 130]})
    for bad in ("-61", "a-", "a-2d", "", "a.b"):  # not the token of any name
        with pytest.raises(ValueError, match="not a name token"):
            token_name(bad)


def test_hostile_names_round_trip_through_a_registry(mlflow_store) -> None:
    """Registered models, logged models and runs named by the mapping, read back from the store
    and decoded: the names that went in."""
    from tasks.tracking import connect

    t = connect()
    client, pairs = t.store.client, [(m, s) for m in HOSTILE[:8] for s in SYSTEMS[2:4]]
    for method, system in pairs:
        client.create_registered_model(registered_model_name(method, system))
        client.create_logged_model(t.experiment_id, name=logged_model_name(method, system, 0))
    back = {split_registered_name(m.name) for m in client.search_registered_models()}
    assert back == set(pairs)
    logged = {m.name for m in client.search_logged_models([t.experiment_id])}
    assert logged == {logged_model_name(m, s, 0) for m, s in pairs}
