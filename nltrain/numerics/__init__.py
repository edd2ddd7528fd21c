"""The numerics fingerprints of the training floor: what says whether a stored cell's numbers are
still today's. A model's and a system's fingerprint (:func:`model_fingerprint`,
:func:`system_fingerprint`) are the bytes of a miniature training on a canary
(:func:`canary_split`, :func:`canary_training`), cached per source state (:func:`source_key`:
every file that can move a number, :func:`covered_sources`); the pinned bytes
(:data:`PINNED`, :func:`check_pinned`) are what the portable CPU kernels must reproduce on any
x86-64 CPU with AVX2 and FMA.

How reuse decides is read in one place from the orchestration floor:
:mod:`tasks.machine` (its :mod:`~tasks.machine.numerics` and :mod:`~tasks.machine.reuse`) on
top of these; the CPU numerics themselves are :mod:`nlmodels.numerics`'. Names load on first
use (PEP 562): importing this package loads neither torch nor numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from nltrain.numerics._fingerprints import (
        FINGERPRINT_FORMAT,
        model_fingerprint,
        model_settings,
        source_key,
        system_fingerprint,
        training_digest,
    )
    from nltrain.numerics._miniature import canary_split, canary_training, settings_text
    from nltrain.numerics._pinned import (
        PINNED,
        PINNED_SETTINGS,
        PINNED_WITH,
        Mismatch,
        PinnedCheck,
        check_pinned,
        data_digest,
        last_pinned_check,
        pinned_label,
        pinned_mismatches,
        pinned_model,
    )
    from nltrain.numerics._sources import NUMERIC_PACKAGES, covered_sources

_LAZY = {
    "FINGERPRINT_FORMAT": "_fingerprints",
    "model_fingerprint": "_fingerprints",
    "model_settings": "_fingerprints",
    "source_key": "_fingerprints",
    "system_fingerprint": "_fingerprints",
    "training_digest": "_fingerprints",
    "canary_split": "_miniature",
    "canary_training": "_miniature",
    "settings_text": "_miniature",
    "PINNED": "_pinned",
    "PINNED_SETTINGS": "_pinned",
    "PINNED_WITH": "_pinned",
    "Mismatch": "_pinned",
    "PinnedCheck": "_pinned",
    "check_pinned": "_pinned",
    "data_digest": "_pinned",
    "last_pinned_check": "_pinned",
    "pinned_label": "_pinned",
    "pinned_mismatches": "_pinned",
    "pinned_model": "_pinned",
    "NUMERIC_PACKAGES": "_sources",
    "covered_sources": "_sources",
}

__all__ = [
    "FINGERPRINT_FORMAT",
    "NUMERIC_PACKAGES",
    "PINNED",
    "PINNED_SETTINGS",
    "PINNED_WITH",
    "Mismatch",
    "PinnedCheck",
    "canary_split",
    "canary_training",
    "check_pinned",
    "covered_sources",
    "data_digest",
    "last_pinned_check",
    "model_fingerprint",
    "model_settings",
    "pinned_label",
    "pinned_mismatches",
    "pinned_model",
    "settings_text",
    "source_key",
    "system_fingerprint",
    "training_digest",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
