"""The model URIs a command accepts, read with the standard library only (a wrong one is
answered before MLflow loads): a registered version by alias or number, an MLflow 3 logged
model, or a run's model.

- ``models:/NAME@ALIAS`` and ``models:/NAME/VERSION``: a version of a registered model;
- ``models:/m-<id>``: a logged model (MLflow 3 names them ``m-`` and 32 hex digits);
- ``runs:/<run id>/model``: the model a cell's run logged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["ACCEPTED", "ModelUri", "parse_model_uri"]

#: What a model URI may be, in the words of every message that refuses one.
ACCEPTED = (
    "models:/NAME@ALIAS, models:/NAME/VERSION, models:/m-<logged model id> or runs:/<run id>/model"
)

_LOGGED = re.compile(r"m-[0-9a-f]{32}")
_RUN = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class ModelUri:
    """A parsed model URI: ``kind`` says which of the accepted forms it is."""

    uri: str
    kind: Literal["alias", "version", "logged", "run"]
    name: str = ""  # the registered model (alias, version)
    ref: str = ""  # the alias or the version number
    model_id: str = ""  # logged
    run_id: str = ""  # run

    @property
    def registered(self) -> bool:
        return self.kind in ("alias", "version")


def parse_model_uri(uri: str) -> ModelUri:
    """``uri`` as one of the accepted forms; ``ValueError`` in one line saying them."""
    if uri.startswith("runs:/"):
        run_id, _, path = uri.removeprefix("runs:/").partition("/")
        if _RUN.fullmatch(run_id) and path.strip("/") == "model":
            return ModelUri(uri, "run", run_id=run_id)
    elif uri.startswith("models:/"):
        ref = uri.removeprefix("models:/")
        if _LOGGED.fullmatch(ref):
            return ModelUri(uri, "logged", model_id=ref)
        name, at, alias = ref.partition("@")
        if at and name and alias and "/" not in name:
            return ModelUri(uri, "alias", name=name, ref=alias)
        name, slash, version = ref.rpartition("/")
        if slash and name and version.isdigit() and "/" not in name:
            return ModelUri(uri, "version", name=name, ref=version)
        if ref and not ({"@", "/"} & set(ref)):
            raise ValueError(
                f"{uri!r} names no version: use models:/{ref}@champion or models:/{ref}/1"
            )
    raise ValueError(f"expected a model URI ({ACCEPTED}), got {uri!r}")
