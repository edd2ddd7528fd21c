"""The report's output folder: written only where the report owns the files (its manifest,
:data:`MANIFEST`, lists each with the hash of what it wrote)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MANIFEST", "OwnedFolder", "UnownedFiles"]

MANIFEST = ".nllab-report.json"


class UnownedFiles(FileExistsError):
    """Files the report would replace that it did not write (or that were edited since)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = tuple(paths)
        shown = ", ".join(str(p) for p in self.paths[:5]) + (" …" if len(self.paths) > 5 else "")
        super().__init__(
            f"{len(self.paths)} file(s) in the way that nllab report did not write or that were "
            f"changed since: {shown}; choose another --out, or --force to replace them"
        )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class OwnedFolder:
    """A folder where the report writes only files it owns.

    A file is owned when the manifest lists it with the hash of its current content. Owned files
    are replaced; owned files not written again are removed (they were ours and unchanged);
    anything else is left alone, and writing over it raises :class:`UnownedFiles` unless
    ``force``. Nothing is written before every target has been checked.
    """

    root: Path
    force: bool = False
    _files: dict[str, bytes] = field(default_factory=dict)

    def add(self, name: str, data: bytes | str) -> Path:
        self._files[name] = data.encode("utf-8") if isinstance(data, str) else data
        return self.root / name

    def _manifest(self) -> dict[str, str]:
        try:
            return json.loads((self.root / MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def _owned(self, name: str, manifest: Mapping[str, str]) -> bool:
        path = self.root / name
        try:
            return manifest.get(name) == _sha(path.read_bytes())
        except OSError:
            return False

    def commit(self) -> list[Path]:
        """Check, then write every added file; returns their paths."""
        manifest = self._manifest()
        in_the_way = [
            self.root / n
            for n in self._files
            if (self.root / n).exists() and not self._owned(n, manifest)
        ]
        if (self.root / MANIFEST).exists() and not manifest:
            in_the_way.append(self.root / MANIFEST)
        if in_the_way and not self.force:
            raise UnownedFiles(in_the_way)
        for name, data in self._files.items():
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(path)
        for name in set(manifest) - set(self._files):
            if self._owned(name, manifest):  # ours, unchanged, no longer part of the report
                (self.root / name).unlink()
        record = {
            "written_by": "nllab report",
            "files": {n: _sha(d) for n, d in self._files.items()},
        }
        (self.root / MANIFEST).write_text(json.dumps(record, indent=1, sort_keys=True))
        return [self.root / n for n in self._files]
