"""``nllab models``: the models a run can use: the built-in ones and those of installed plugins
(entry points of ``nllab.models``), with their source, the paper's table where it has one and
their epochs in the quick profile, read from the packages' metadata without importing torch or
any plugin; a plugin left out by the naming rule (:mod:`tasks.config.plugins`) is named with its
package. ``nllab models NAME ...`` also gives those models' options (constructor keywords and
defaults), importing them; ``--names`` lists the names only."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("models", help="list the models: built-in and from plugins")
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="models whose options to show (imports them), e.g. node or package.module:Class",
    )
    p.add_argument("--names", dest="names_only", action="store_true", help="names only")
    p.set_defaults(handler=run)
    return p


def _quick_epochs(name: str, profile: dict, cards, default: int) -> int:
    """The quick profile's epochs of ``name``: the profile's, else its registration's."""
    card = cards.get(name)
    return profile.get(name) or (card.quick_epochs if card is not None else None) or default


def _rows() -> tuple[list[tuple[str, str, str, str]], tuple[str, ...]]:
    """(name, source, paper, quick epochs) of every model a run can name, and the lines of the
    plugins left out."""
    from tasks.config import BUILTIN_METHODS, PAPER_METHODS, QUICK_EPOCHS
    from tasks.config.names import DEFAULT_QUICK_EPOCHS, MODEL_CARDS
    from tasks.config.plugins import MODEL_GROUP, plugin_table

    table = plugin_table(MODEL_GROUP, BUILTIN_METHODS)
    sources = {m: "built-in" for m in BUILTIN_METHODS} | {
        n: f"plugin {p}" for n, p in table.usable.items()
    }
    rows = [
        (
            name,
            source,
            "Table 3" if name in PAPER_METHODS else "—",
            f"{_quick_epochs(name, QUICK_EPOCHS, MODEL_CARDS, DEFAULT_QUICK_EPOCHS)} epochs",
        )
        for name, source in sorted(sources.items())
    ]
    return rows, tuple(table.left_out.values())


def _options(names: list[str]) -> int:
    """Each named model's source and options, importing it (a plugin: only that one)."""
    from flows.cli.common import UsageError
    from nlmodels.model_registry import find_model, model_signature, model_sources

    for name in names:
        try:
            find_model(name)
            options = model_signature(name)
        except (ValueError, KeyError) as e:
            message = f"unknown model {name!r}" if isinstance(e, KeyError) else str(e)
            raise UsageError(message) from None
        source = model_sources().get(name, "built-in")
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
        print(f"{name}: {source}; options: {shown or 'none'}")
    return 0


def run(args: argparse.Namespace) -> int:
    rows, left_out = _rows()
    if args.names_only:
        print("\n".join(r[0] for r in rows))
        return 0
    if args.names:
        return _options(args.names)
    head = ("model", "source", "paper", "quick profile")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    for line in left_out:
        print(f"left out: {line}")
    print("options of a model: nllab models NAME")
    return 0
