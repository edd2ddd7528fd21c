"""Reading config layers: a user's config file (TOML, JSON or YAML), the profiles the package
ships as such files (``tasks/profiles/<name>.yaml``), and merging layers in order.

No validation here: :func:`tasks.config.resolve_config` validates the merged layers.
"""

from __future__ import annotations

import copy
import functools
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "PROFILE_DIR",
    "ConfigError",
    "deep_merge",
    "lift_execution",
    "load_config_file",
    "profile_file",
    "profile_layer",
]

#: Where the shipped profiles live, one config file per profile.
PROFILE_DIR = Path(__file__).resolve().parents[1] / "profiles"


class ConfigError(ValueError):
    """An invalid configuration value; the message names the problem and the valid choices."""


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML, JSON or YAML config file (validated later by :func:`resolve_config`)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory, not a file")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(p.read_text())
        elif suffix == ".json":
            data = json.loads(p.read_text())
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(p.read_text()) or {}
        else:
            raise ConfigError(
                f"config file {p.name!r}: unknown format {suffix!r}; "
                "valid: .toml, .json, .yaml, .yml"
            )
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"config file {str(p)!r} is not valid {suffix[1:].upper()}: {e}") from e
    except ImportError as e:  # pragma: no cover - yaml ships with mlflow/prefect
        raise ConfigError("YAML config files need PyYAML installed") from e
    except Exception as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config file {str(p)!r} could not be parsed: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a table/mapping at the top level")
    return _anchor_files(data, p.resolve().parent)


def _anchor_files(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A declared system's relative ``file`` read from the config file's folder (so the
    config works from any working directory)."""
    defs = data.get("define_systems")
    if not isinstance(defs, Mapping):
        return data
    anchored = {}
    for name, d in defs.items():
        if isinstance(d, Mapping) and isinstance(d.get("file"), str):
            d = {**d, "file": str(folder / Path(d["file"]).expanduser())}
        anchored[name] = d
    return {**data, "define_systems": anchored}


def profile_file(name: str) -> Path:
    """The shipped config file of profile ``name`` (``tasks/profiles/<name>.yaml``)."""
    return PROFILE_DIR / f"{name}.yaml"


@functools.cache
def _profile_layer(name: str) -> dict[str, Any]:
    layer = load_config_file(profile_file(name))
    if layer.pop("profile", name) != name:
        raise ConfigError(f"{profile_file(name)} names another profile")
    return layer


def profile_layer(name: str) -> dict[str, Any]:
    """Profile ``name``'s layer over the defaults, read from its file once (a fresh copy each
    call); the file's own ``profile`` key, which makes ``--config`` of the file equal to
    ``--profile``, is left out."""
    return copy.deepcopy(_profile_layer(name))


def lift_execution(layer: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """A config layer with its top-level execution settings (``keys``) moved under
    ``execution``, so that layers merge setting by setting whichever spelling each uses."""
    keys = tuple(keys)
    out = {k: v for k, v in layer.items() if k not in keys}
    lifted = {k: layer[k] for k in keys if k in layer}
    if lifted or "execution" in layer:
        out["execution"] = {**dict(layer.get("execution") or {}), **lifted}
    return out


def deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, table by table; per-method model overrides merge keyword by
    keyword (``models.<method>.<keyword>``)."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) and k != "models":
            out[k] = deep_merge(dict(out[k]), v)
        elif isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            # per-method overrides merge one level deeper (method -> keyword)
            merged = dict(out[k])
            for method, kw in v.items():
                merged[method] = {**merged.get(method, {}), **kw}
            out[k] = merged
        else:
            out[k] = v
    return out
