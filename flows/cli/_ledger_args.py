"""The options of ``nllab ledger`` (:mod:`flows.cli.ledger`): the cells chosen, and the options
of each action in a group that remembers which actions it serves (:class:`Scoped`)."""

from __future__ import annotations

import argparse

from flows.cli import common as cli
from flows.cli.values import positive_number

__all__ = [
    "Scoped",
    "add_execution_options",
    "add_run_options",
    "add_selection",
    "add_table_options",
    "ledger_studies",
    "scoped_group",
]


class Scoped:
    """An argument group whose options apply to some actions only: it remembers each option it
    adds (``add_argument`` returns the ``argparse.Action``), so that the command's precheck
    refuses every one of them given to another action, without a list kept by hand."""

    def __init__(self, group, actions: tuple[str, ...], scoped: list) -> None:
        self.group, self.actions, self.scoped = group, actions, scoped

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = self.group.add_argument(*args, **kwargs)
        self.scoped.append((action, self.actions))
        return action

    def add_mutually_exclusive_group(self) -> Scoped:
        return Scoped(self.group.add_mutually_exclusive_group(), self.actions, self.scoped)


def scoped_group(p: argparse.ArgumentParser, title: str, scoped: list) -> Scoped:
    """The group ``title`` (``run``, ``run and record``, ...): its options apply to the actions
    its title names."""
    return Scoped(p.add_argument_group(title), tuple(title.split(" and ")), scoped)


def add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--systems", nargs="+", type=cli.names, metavar="NAME", help="systems (default: main table)"
    )
    p.add_argument(
        "--methods", nargs="+", type=cli.names, metavar="NAME", help="models (default: all nine)"
    )
    p.add_argument(
        "--seeds",
        nargs="+",
        type=cli.names,
        metavar="N",
        help="seeds (default: the profile's, 0-4)",
    )
    p.add_argument(
        "--ablation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the stereographic ablation's cells only (--no-ablation: Table 3's only; default: "
        "both; `run` trains the ablation after every Table 3 column has a seed)",
    )
    p.add_argument(
        "--study",
        nargs="+",
        type=cli.names,
        metavar="NAME",
        help="the cells of these studies' tables only (the paper's other tables at its budget: "
        f"{', '.join(ledger_studies())}; a study cell that is a Table 3 cell shares its "
        "record, and `run` measures what a study measures of a model it trains, such as a "
        "Table 3 cell's CMI, whatever is selected); default: every study's too, unless "
        "--ablation/--peers is given; `run` trains "
        "each table's first seed after Table 3's first seed, the rest after Table 3's; `table "
        "--study NAME` draws the study's table and figures from the records",
    )
    p.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the Laplace-domain peers' cells only (Laplace-Net, the Laplace Neural Operator, "
        "the neural DDE: not Table 3's; one cell under both profiles; --no-peers: without "
        "them; default: theirs too, unless --ablation/--no-ablation is given; `run` trains "
        "them last, after Table 3, the ablation and the paper's other tables)",
    )


def add_table_options(table: Scoped) -> None:
    table.add_argument(
        "--format", choices=("terminal", "markdown"), default="terminal", help="table format"
    )
    table.add_argument(
        "--readme", metavar="FILE", help="rewrite the ledger block of this page (docs/results/)"
    )
    table.add_argument(
        "--figures",
        metavar="DIR",
        help="with --study: also write the study's figures, drawn from the records, to DIR "
        "(STUDY-NAME.png)",
    )


def add_run_options(training: Scoped) -> None:
    limit = training.add_mutually_exclusive_group()
    limit.add_argument(
        "--max-hours",
        type=positive_number("hours", 10_000),
        metavar="H",
        help="stop after H hours (running cells end KILLED, finished ones are kept)",
    )
    limit.add_argument(
        "--max-minutes",
        type=positive_number("minutes", 600_000),
        metavar="M",
        help="stop after M minutes (as --max-hours); a group of cells expected to take longer "
        "than the time left is cut to the packs that fit, or not started (expected: measured "
        "here on a GPU or where the ledger has no record of the method on this kind of device, "
        "else from those records); on a GPU its packs then train one after another",
    )
    training.add_argument(
        "--report-minutes",
        type=positive_number("minutes", 600_000, zero=True),
        metavar="M",
        help="say every M minutes where the running cells stand: epoch, pace, time to go "
        "(as `ledger status --training`; default: 10; 0: never)",
    )
    keep = training.add_mutually_exclusive_group()
    keep.add_argument(
        "--checkpoints",
        metavar="DIR",
        help="folder where each training cell keeps a checkpoint between epochs, so that a cell "
        "stopped (time limit, Ctrl-C, the machine gone) resumes where it stood, to the same "
        "bytes (default: checkpoints/ beside the ledger file; commit it to carry a run over)",
    )
    keep.add_argument(
        "--no-checkpoints", action="store_true", help="keep no checkpoints: a stopped cell restarts"
    )
    training.add_argument(
        "--checkpoint-minutes",
        type=positive_number("minutes", 10_000, zero=True),
        metavar="M",
        help="least minutes between two checkpoints of a cell (default: 5; 0: every epoch)",
    )
    training.add_argument(
        "--refresh-older",
        action="store_true",
        help="also retrain the cells whose records older numerics made",
    )
    training.add_argument(
        "--nice",
        type=cli.niceness,
        default=19,
        metavar="N",
        help="CPU niceness added, 0 to 19 (default: 19; 0 keeps it); in a session of its own "
        "(setsid) its Linux autogroup's too, so that it yields to other sessions",
    )


def add_execution_options(execution: Scoped) -> None:
    from tasks.config import DEVICES

    execution.add_argument(
        "--max-workers", type=cli.positive_int, metavar="N", help="cells at once"
    )
    execution.add_argument(
        "--torch-threads", type=cli.positive_int, metavar="N", help="torch threads per cell"
    )
    execution.add_argument("--device", choices=DEVICES, help="default: auto")
    execution.add_argument(
        "--no-register", action="store_true", help="leave the model registry alone"
    )
    cli.add_runner_options(execution, checkpoints=False)  # run's own, beside the ledger


def ledger_studies() -> tuple[str, ...]:
    from flows.studies import LEDGER_STUDIES

    return LEDGER_STUDIES
