"""One reversible mapping from the platform's names (methods, systems) to MLflow's names: run
names, logged-model names and registered-model names all derive from :func:`name_token`.

MLflow's own rules (``mlflow.utils.validation``, MLflow 3): a registered model's name may not
contain ``/`` or ``:`` nor resolve to another path (``.``, ``..``); a logged model's name may
not contain ``/ : . % " '``; metric and tag keys take letters, digits, ``_ - . space : /``.
Server databases bound the lengths (a registered name 256 characters, a run name 250).

A method may be any text: ``node``, a plugin's entry-point name, or ``package.module:Class``.
:func:`name_token` keeps letters, digits and ``_`` and writes every other character as ``-``
and the two upper-case hex digits of each of its UTF-8 bytes (percent-encoding, RFC 3986
section 2.1, with ``-`` for ``%``, which logged-model names refuse), so
``pkg.mod:Class`` becomes ``pkg-2Emod-3AClass``; a leading hex digit (``0-9 A-F``) is written
so too, which keeps ``TOKEN-TOKEN`` compositions readable in one way only (a ``-`` followed by
anything but two upper-case hex digits is a separator). Built-in names (``[a-z][a-z0-9_]*``)
are their own tokens, so run names and registered names of the built-in models never change.

Tag *values* (``method``, ``system``) keep the name itself: MLflow takes any text there, and
the readers of the store (reports, compare) show it as the user wrote it.
"""

from __future__ import annotations

import re

__all__ = [
    "LEGACY_REGISTERED",
    "MAX_TOKEN",
    "logged_model_name",
    "name_problem",
    "name_token",
    "registered_model_name",
    "split_registered_name",
    "token_name",
]

#: The longest token: a registered name of two (``TOKEN-TOKEN``) stays within MLflow's 256.
MAX_TOKEN = 120
#: Methods whose registered models kept the name they had before this mapping (the champions
#: of existing stores are found again): ``neural_laplace`` -> ``neural-laplace-<system>``.
LEGACY_REGISTERED = {"neural_laplace": "neural-laplace"}

_KEEP = re.compile(r"[A-Za-z0-9_]")
_HEX = "0123456789ABCDEF"
_ESCAPE = re.compile(r"-([0-9A-F]{2})")
_TOKEN = re.compile(r"(?:[A-Za-z0-9_]|-[0-9A-F]{2})+")


def _escaped(char: str) -> str:
    return "".join(f"-{b:02X}" for b in char.encode("utf-8", "surrogatepass"))


def name_token(name: str) -> str:
    """``name`` as MLflow may name it (see the module): ``ValueError`` for an empty name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a method or system name must be non-empty text, got {name!r}")
    out = [_escaped(c) if not _KEEP.fullmatch(c) else c for c in name]
    if name[0] in _HEX:
        out[0] = _escaped(name[0])
    return "".join(out)


def token_name(token: str) -> str:
    """The name whose :func:`name_token` is ``token`` (``ValueError`` if none is)."""
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"{token!r} is not a name token")
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "-":
            raw.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(token[i].encode())
            i += 1
    name = raw.decode("utf-8", "surrogatepass")
    if name_token(name) != token:  # e.g. "-61" for "a": a second spelling of one name
        raise ValueError(f"{token!r} is not a name token (that name's token is another)")
    return name


def name_problem(kind: str, name: str) -> str | None:
    """Why ``name`` (a ``kind``: method or system) cannot name MLflow objects, or ``None``."""
    try:
        token = name_token(name)
    except ValueError as e:
        return str(e)
    if len(token) > MAX_TOKEN:
        shown = name if len(name) <= 60 else name[:57] + "..."
        return (
            f"{kind} name {shown!r} is too long for MLflow's names: {len(token)} characters "
            f"once escaped, at most {MAX_TOKEN}"
        )
    return None


def registered_model_name(method: str, system: str) -> str:
    """The registered model holding the champion of ``method`` on ``system``:
    ``node-integro_de``, ``pkg-2Emod-3AClass-integro_de``; Neural Laplace keeps
    ``neural-laplace-<system>``."""
    head = LEGACY_REGISTERED.get(method) or name_token(method)
    return f"{head}-{name_token(system)}"


def split_registered_name(name: str) -> tuple[str, str]:
    """``(method, system)`` of a :func:`registered_model_name` (``ValueError`` otherwise)."""
    for method, head in LEGACY_REGISTERED.items():
        if name.startswith(head + "-"):
            return method, token_name(name[len(head) + 1 :])
    # the separator: the first "-" that does not begin an escape ("-" and two hex digits)
    at = next((m.start() for m in re.finditer("-", name) if not _ESCAPE.match(name, m.start())), -1)
    if at <= 0:
        raise ValueError(f"{name!r} is not a registered model name of the platform")
    return token_name(name[:at]), token_name(name[at + 1 :])


def logged_model_name(method: str, system: str, seed: int) -> str:
    """A cell's logged model in the Models tab: ``neural_laplace-integro_de-s0``."""
    return f"{name_token(method)}-{name_token(system)}-s{int(seed)}"
