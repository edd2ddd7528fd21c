"""``nllab systems``: the systems a run can use: the built-in ones, those a config file declares
from a data file or a simulator (``[define_systems.NAME]``), and the simulators packages offer
(entry points of ``nllab.systems``), with their source, state dimension and options, and the
paper's table where it has one. Reads numpy and the files, never torch (``--names``: not even
numpy)."""

from __future__ import annotations

import argparse
import json

from flows.cli import common as cli

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("systems", help="list the systems: built-in, from files, from plugins")
    p.add_argument("--config", metavar="FILE", help="also the systems this config declares")
    p.add_argument("--names", action="store_true", help="names only (no data file is read)")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    from tasks.config import MAIN_SYSTEMS, SYSTEM_NAMES, load_config_file
    from tasks.config.declarations import declared_names
    from tasks.config.plugins import SYSTEM_GROUP, plugin_table

    layer = load_config_file(args.config) if args.config else {}
    table = plugin_table(SYSTEM_GROUP, SYSTEM_NAMES)  # from the packages' metadata
    declared, plugins = declared_names(layer), table.usable
    if args.names:
        print("\n".join([*SYSTEM_NAMES, *declared, *(p for p in plugins if p not in declared)]))
        return 0
    from datasets import SYSTEMS

    rows = [
        (
            n,
            SYSTEMS[n].state_dim,
            "built-in",
            ", ".join(sorted(SYSTEMS[n].properties)) or "—",
            "Table 3" if n in MAIN_SYSTEMS else "Appendix C",
        )
        for n in SYSTEM_NAMES
    ]
    from pydantic import ValidationError

    from tasks.config import declare_systems
    from tasks.config.checks import format_validation

    try:
        sources = declare_systems(layer, names=declared)
    except ValidationError as err:
        raise cli.UsageError(format_validation(err)) from None
    except ValueError as err:  # a data file's or a simulator's problem, in one line
        raise cli.UsageError(str(err)) from None
    for name, source in sources.items():
        info = SYSTEMS[name]
        options = json.dumps(source.options) if source.options else ""
        rows.append(
            (
                name,
                info.state_dim,
                f"{info.source} {options}".strip(),
                f"N={info.default_trajectories} T={info.default_points}",
                "—",
            )
        )
    for name, plugin in plugins.items():
        if name not in declared:
            rows.append((name, "?", f"plugin simulator {plugin}", "declare it to use it", "—"))
    head = ("system", "D", "source", "details", "paper")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    for name, line in table.left_out.items():
        if name not in declared:
            print(f"left out: {line}")
    return 0
