"""The checks behind :mod:`tasks.config`'s validation and their one-line messages: names
(systems, methods), strict value kinds, and a config's model options against what each model's
constructor accepts.

What a model accepts is read from the model registry (:mod:`nlmodels.model_registry`), on first
use: importing this module does not import torch (``nllab --help`` stays fast). Every problem is
one line naming its model and option (``node setting 'hidden' must be ...``).
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from pydantic import ConfigDict, ValidationError

__all__ = [
    "MAX_WIDTH",
    "ModelOptionError",
    "check_model_overrides",
    "check_names",
    "format_validation",
    "option_problems",
    "show",
    "unknown_names",
    "validation_problems",
]


#: The largest layer width (or other size-like integer option) a model takes: the paper's
#: models are 16 to 128 wide, and one layer of this width already holds 2^32 weights.
MAX_WIDTH = 65_536


class ModelOptionError(ValueError):
    """Model options that the model's constructor would refuse or misread: one line each,
    each line naming its model and option (``node setting 'hidden' must be ...``)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def show(value: Any) -> str:
    """A value as a config file spells it (``true``, ``"128"``)."""
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


@functools.cache
def _strict_adapter(hint: Any) -> Any:
    """A strict pydantic validator of ``hint`` (no string -> sequence, no bool -> int, no
    string -> number), or ``None`` for a type that no config value can hold (a module)."""
    from pydantic import TypeAdapter
    from pydantic.errors import PydanticSchemaGenerationError

    try:
        return TypeAdapter(hint, config=ConfigDict(strict=True))
    except PydanticSchemaGenerationError:
        return None


def _range_problem(hint: Any, value: Any, default: Any) -> str | None:
    """A number outside the range its default implies: an integer option whose default is
    positive (a width, a count) must be at least 1, one whose default is 0 at least 0; a float
    option with a positive default (a tolerance, a scale) must be positive; layer widths are
    at least 1; widths and positive integer options at most :data:`MAX_WIDTH`. The models'
    constructors refuse (or silently misbuild) anything else."""
    if isinstance(value, bool) or isinstance(default, bool):
        return None
    if isinstance(value, int) and isinstance(default, int):
        low = 1 if default > 0 else 0 if default == 0 else None
        if low is not None and value < low:
            return f"must be at least {low}, got {value}"
        if default > 0 and value > MAX_WIDTH:
            return f"must be at most {MAX_WIDTH}, got {value}"
    elif isinstance(value, int | float) and isinstance(default, float) and default > 0:
        if value <= 0:
            return f"must be positive, got {value}"
    elif isinstance(value, list | tuple) and isinstance(default, list | tuple):
        bad = [w for w in value if isinstance(w, int) and w < 1]
        if bad:
            return f"layer widths must be at least 1, got {list(value)}"
        if any(isinstance(w, int) and w > MAX_WIDTH for w in value):
            return f"layer widths must be at most {MAX_WIDTH}, got {list(value)}"
    return None


_KIND_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a flag",
    list: "a list",
    tuple: "a list",
}


def _describe_type(hint: Any) -> str:
    import typing
    from collections.abc import Sequence

    origin = typing.get_origin(hint)
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is bool:
        return "true or false"
    if hint is str:
        return "a string"
    if origin in (Sequence, list, tuple) and get_args(hint)[:1] == (int,):
        return "a list of integers such as [64, 64]"
    args = [a for a in get_args(hint) if a is not type(None)]
    if len(args) == 1:
        return f"{_describe_type(args[0])} (or left out)"
    return str(hint)


def _some_part_holds(hint: Any, value: Any) -> bool:
    """Whether a member of the union ``hint`` that a config value can be (a string, a number)
    holds ``value``; its other members are Python objects (a module)."""
    for part in get_args(hint):
        adapter = _strict_adapter(part)
        if adapter is None:
            continue
        try:
            adapter.validate_python(value)
        except ValidationError:
            continue
        return True
    return False


def _type_name(hint: Any) -> str:
    return " | ".join(
        getattr(a, "__qualname__", str(a)) if a is not type(None) else "None"
        for a in (get_args(hint) or (hint,))
    )


def option_problems(method: str, overrides: Mapping[str, Any]) -> list[str]:
    """What is wrong with each model option of ``overrides`` (empty when all are valid)."""
    from nlmodels import model_registry as models

    valid = models.model_arguments(method)
    unknown = [k for k in overrides if k not in valid]
    if unknown:
        return [
            f"unknown {method} setting {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}"
        ]
    problems = []
    choices = {
        **{k: v for k, v in models.registry_choices(method).items() if k in valid},
        **models.model_choices(method),
    }
    hints, defaults = models.model_option_types(method), models.model_signature(method)
    for name, value in overrides.items():
        where = f"{method} setting {name!r}"
        if name in choices:
            if value not in choices[name] or isinstance(value, bool):
                problems.append(
                    f"{where} must be one of {', '.join(map(repr, choices[name]))}, got {value!r}"
                )
            continue
        adapter = _strict_adapter(hints[name]) if name in hints else None
        if adapter is None:
            if name in hints and value is not None and not _some_part_holds(hints[name], value):
                problems.append(
                    f"{where} takes a Python object ({_type_name(hints[name])}), which a config "
                    f"cannot give; got {show(value)}"
                )
            continue
        try:
            adapter.validate_python(value)
        except ValidationError:
            problems.append(
                f"{where} must be {_describe_type(hints[name])}, got {show(value)} "
                f"({_KIND_NAMES.get(type(value), type(value).__name__)})"
            )
            continue
        if (problem := _range_problem(hints[name], value, defaults.get(name))) is not None:
            problems.append(f"{where} {problem}")
    return problems


def check_model_overrides(method: str, overrides: Mapping[str, Any]) -> None:
    """Raise :class:`ModelOptionError` listing every option of ``overrides`` that ``method``'s
    constructor does not take, or would refuse or misread: the value is checked strictly against
    the constructor's annotation, its ``Literal`` choices, the solver and ILT registries, and the
    range its default implies (:func:`_range_problem`). An unknown method is left to the check
    of method names."""
    from nlmodels import MODELS

    if method in MODELS and (problems := option_problems(method, overrides)):
        raise ModelOptionError(problems)


def _nearest(name: str, valid: Sequence[str]) -> str | None:
    """The valid name ``name`` most likely misspells (:func:`difflib.get_close_matches`), else
    the one valid name that begins with it (``lotka`` for ``lotka_volterra_dde``), else ``None``."""
    close = difflib.get_close_matches(name, valid, n=1)
    if close:
        return close[0]
    starting = [v for v in valid if name and v.startswith(name)]
    return starting[0] if len(starting) == 1 else None


def unknown_names(kind: str, unknown: Sequence[str], valid: Sequence[str]) -> str:
    """The one line that refuses ``unknown`` ``kind`` names: each with the valid name it most
    likely misspells, then every valid one (``unknown method 'nod' (did you mean 'node'?);
    valid: anode, ...``)."""
    named = []
    for name in unknown:
        near = _nearest(name, valid)
        named.append(repr(name) + (f" (did you mean {near!r}?)" if near is not None else ""))
    return f"unknown {kind} {', '.join(named)}; valid: {', '.join(valid)}"


def check_names(kind: str, names: tuple[str, ...], valid: tuple[str, ...]) -> tuple[str, ...]:
    if not names:
        raise ValueError(f"at least one {kind} is required; valid {kind}s: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(unknown_names(kind, unknown, valid))
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate {kind} in {list(names)}")
    return names


def validation_problems(
    err: ValidationError,
    *,
    skip: int = 0,
    names: Mapping[str, str] | None = None,
    show_input: bool = False,
) -> list[str]:
    """Each problem of a pydantic ``err`` as ``key.path: what is wrong`` (``unknown setting``
    for a key no section has; each model option of a :class:`ModelOptionError` on its own):
    the one way every command names a config problem. ``skip``: leading key parts left out of
    the path (a wrapper's own; a problem of the wrapped value as a whole then has no path);
    ``names``: a field's name as the user wrote it, where it differs; ``show_input``: append
    the value given."""
    lines = []
    for e in err.errors():
        parts = [str(x) for x in e["loc"][skip:]]
        where = ".".join((names or {}).get(x, x) for x in parts) or ("" if skip else "config")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown setting"
        elif show_input and "input" in e:
            msg += f" (got {show(e['input'])})"
        cause = (e.get("ctx") or {}).get("error")
        problems = cause.problems if isinstance(cause, ModelOptionError) else [msg]
        lines += [f"{where}: {problem}" if where else problem for problem in problems]
    return lines


def format_validation(err: ValidationError) -> str:
    """A config's :func:`validation_problems`: one line when there is one, else one per
    indented line under a heading."""
    problems = validation_problems(err)
    if len(problems) == 1:
        return f"invalid configuration: {problems[0]}"
    return "invalid configuration:\n" + "\n".join(f"  {line}" for line in problems)
