"""The ledger as people read it: ``nllab ledger status``'s report and the tables of ``nllab ledger
table`` (terminal or Markdown, the ledger page's generated block), from :mod:`tasks.ledger.views`'
data. The command and the docs' generator both print through here."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from flows.ledger.study_text import made_by, study_lines

if TYPE_CHECKING:
    from collections.abc import Iterable

    from flows.ledger.forecast import Forecast
    from flows.ledger.groups import LedgerGroup
    from tasks.ledger import CellProgress, CellState, LedgerStatus
    from tasks.ledger.views import BestOfSystem

__all__ = [
    "count_legend",
    "forecast_text",
    "interim_ranking",
    "ledger_markdown",
    "protocols_markdown",
    "readme_ledger",
    "status_text",
    "tables",
    "training_text",
]


def count_legend(older: int, gpu: int) -> str:
    """What a cell's seed count says, in sentences: ``n=5`` always, and ``2 older`` or
    ``1 on GPU`` beside it only when the table shows some (``older``, ``gpu``: how many)."""
    parts = ["In each cell, n is the number of seeds its mean is over."]
    if older:
        parts.append(
            "A count such as `n=5; 2 older` says that 2 of its 5 records were made by other "
            "numerics than today's: `nllab ledger status` lists them and `nllab ledger run "
            "--refresh-older` trains them again."
        )
    if gpu:
        parts.append(
            "A count such as `n=5; 1 on GPU` says that 1 of its 5 records was computed on a GPU, "
            "whose numerics are its own; it counts in the mean and the verdict all the same."
        )
    return " ".join(parts)


# -- status -------------------------------------------------------------------------------------
#: The parts of the ledger as ``status`` names them.
_PARTS = {
    "table3": "Table 3",
    "ablation": "the stereographic ablation (Table 5)",
    "peers": "the Laplace-domain peers (not Table 3's)",
}


def _part(state: CellState) -> str:
    cell = state.cell
    if cell.study:
        return "study"
    return "peers" if cell.peer else "ablation" if cell.ablated else "table3"


def _counts(status: LedgerStatus, part: str) -> str | None:
    states = [s for s in status.states if _part(s) == part]
    if not states:
        return None
    n = Counter(s.state for s in states)
    older = sum(s.numerics == "older" for s in states)
    gpu = sum(s.numerics == "gpu" for s in states)
    on_gpu = f", {gpu} computed on a GPU" if gpu else ""
    what = _PARTS[part]
    predates = n["predates"]
    return (
        f"{what}: {n['recorded']} of {len(states)} selected cells recorded ({older} by older "
        f"numerics{on_gpu}), {n['missing']} missing, {predates} whose "
        f"record{'s' if predates != 1 else ''} predate numerics fingerprints (not counted: "
        "`ledger run` trains them again), "
        f"{n['other_config']} recorded under another config only"
    )


def _time_to_go(p: CellProgress, now: float) -> str:
    """``about 51 min to go (until 01:52)``: minutes (seconds under ten minutes), and the local
    time of day it ends."""
    from tasks.progress import clock

    left = p.seconds_left
    if left is None:
        return "time to go not known yet"
    span = clock(left) if left < 600 else _span(left)
    until = time.strftime("%H:%M", time.localtime(now + left))
    return f"{'at most' if p.may_stop_early else 'about'} {span} to go (until {until})"


def _span(seconds: float) -> str:
    """``1 h 32 min``, ``12 min``: to the minute."""
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def forecast_text(forecast: Forecast) -> str:
    """``ledger status --time-left``: the groups ``ledger run`` would train, in its order,
    each with its expected time here and what that rests on, and their sum."""
    from tasks.reports import plural

    if not forecast.groups:
        return "Time left: none, every selected cell is recorded"
    unknown, n = len(forecast.unknown), len(forecast.groups)
    if unknown == n:
        total = "not known: the ledger has no record of these methods on the CPU"
    else:
        rest = f" (and {plural(unknown, 'group')} without an estimate)" if unknown else ""
        projected = sum(g.projected is not None for g in forecast.groups)
        basis = "the ledger's records"
        if projected:
            whose = "its column" if projected == 1 else "their columns"
            basis += f" ({plural(projected, 'group')} by the projection of {whose})"
        total = f"about {_span(forecast.known_seconds)}{rest}, by {basis}"
    lines = [
        f"Time left: {plural(forecast.cells, 'missing cell')} in {plural(n, 'group')}, as "
        f"`ledger run` trains them here one group after another ({forecast.hardware}, "
        f"{forecast.workers} at once): {total}"
    ]
    for other, ratio in sorted(forecast.ratios.items()):
        lines.append(
            f"  ({other}'s records count at ×{ratio:.2f}: this processor's time on the cells "
            "both recorded)"
        )
    lines += _per_table(forecast)
    labels = [_group_label(g.group) for g in forecast.groups]
    width = max(map(len, labels))
    for label, g in zip(labels, forecast.groups, strict=True):
        if g.seconds is None:
            what = "no record of the method on the CPU: `ledger run` measures it when it starts"
        else:
            if g.projected is not None:
                basis = (
                    f"no record yet: the projection of its column on {g.projected}, "
                    "training epochs only"
                )
            else:
                basis = "this processor's records" if g.here else "other processors' records"
            if g.kept_share:
                basis += f"; {g.kept_share:.0%} of its epochs trained by kept runs, resumed"
            if g.twins:
                basis += f"; {g.twins:.0%} of its cells trained by an earlier group"
            what = f"about {_span(g.seconds):>12}  ({basis})"
        lines.append(f"  {label:<{width}}  {what}")
    return "\n".join(lines)


def _per_table(forecast: Forecast) -> list[str]:
    """Where the groups belong to more than one table: each table's expected time (its
    groups' sum), in the order its first group trains, and its groups without an estimate."""
    from tasks.ledger import PEERS

    def table(group: LedgerGroup) -> str:
        if group.study:
            return group.study
        key = "peers" if group.method in PEERS else "ablation" if group.ablation else "table3"
        return _PARTS[key]

    from tasks.reports import plural

    known: dict[str, list[float]] = {}
    unknown: dict[str, int] = {}
    for g in forecast.groups:
        name = table(g.group)
        known.setdefault(name, [])
        unknown[name] = unknown.get(name, 0) + (g.seconds is None)
        if g.seconds is not None:
            known[name].append(g.seconds)
    if len(known) < 2:
        return []
    width = max(map(len, known))
    lines = ["  Per table (its groups below, summed):"]
    for name, times in known.items():
        groups = plural(unknown[name], "group")
        if not times:
            lines.append(f"    {name:<{width}}  not known ({groups} without an estimate)")
            continue
        rest = f" (and {groups} without an estimate)" if unknown[name] else ""
        lines.append(f"    {name:<{width}}  about {_span(sum(times)):>12}{rest}")
    return lines


def _group_label(group: LedgerGroup) -> str:
    what = group.row
    from tasks.reports import plural

    seeds = f"seed{'s' if len(group.seeds) > 1 else ''} {_seeds(group.seeds)}"
    return f"{what} {seeds}, {plural(group.size, 'cell')}"


def training_text(progress: list[CellProgress], store: str, now: float | None = None) -> str:
    """``ledger status --training``: each selected cell the store is training now, its epoch
    of the planned epochs, its pace over the recent epochs and the time to its last epoch
    (``now``: seconds since the epoch, default the clock's)."""
    now = time.time() if now is None else now
    if not progress:
        return f"Training now: none of the selected cells (tracking store {store})"
    lines = [f"Training now: {len(progress)} of the selected cells (tracking store {store})"]
    width = max(len(p.cell.label) for p in progress)
    for p in progress:
        of = f"/{p.epochs}" if p.epochs is not None else ""
        pace = f"{p.seconds_per_epoch:.1f} s/epoch lately" if p.seconds_per_epoch else "pace —"
        lines.append(
            f"  {p.cell.label:<{width}}  epoch {p.epochs_done}{of}  {pace}  {_time_to_go(p, now)}"
            f"  (run {p.run_id[:8]})"
        )
    return "\n".join(lines)


def status_text(status: LedgerStatus, path: Path) -> str:
    """``ledger status``: counts, the methods × systems grid with each column's verdict, what
    each method still needs, and the records that older numerics or another config made."""
    from tasks.reports import VERDICT_RULE, Table, TableCell, render_table

    groups = status.groups()
    systems = list(dict.fromkeys(g.system for g in groups))
    rows: dict[str, dict[str, TableCell]] = {}
    for g in groups:
        label = f"{g.method} ({g.ablation})" if g.ablation else g.method
        older = f" ({g.older} older)" if g.older else ""
        cell = TableCell(f"{g.recorded}/{g.selected}{older}", verdict=g.verdict)
        rows.setdefault(label, {})[g.system] = cell
    grid = Table(
        ("method", *systems),
        tuple(
            (TableCell(m), *(cells.get(s, TableCell("")) for s in systems))
            for m, cells in rows.items()
        ),
        f"Seeds recorded at today's config, of those selected; {VERDICT_RULE}.",
    )
    held = f"{status.records} records" if path.exists() else "no such file yet (0 records)"
    lines = [f"{path}: {held}"]
    lines += [c for c in map(lambda part: _counts(status, part), _PARTS) if c]
    lines += study_lines(status)
    if groups:
        lines += ["", render_table(grid, "terminal", width=160), ""]
    todo = [s for s in status.states if s.state != "recorded" and not s.cell.study]
    for label, states in _by_label(todo).items():
        lines.append(f"{label} needs {len(states)}: {_cells_phrase(states, systems)}")
    older_states = [s for s in status.flagged("older") if not s.cell.study]  # (studies: a line)
    for label, states in _by_label(older_states).items():
        commits = sorted({(s.record.commit or "unknown")[:7] for s in states if s.record})
        lines.append(
            f"{label}: {len(states)} recorded by older numerics (commit {', '.join(commits)}): "
            f"{_cells_phrase(states, systems)}; `ledger run --refresh-older` retrains them"
        )
    predating = [s for s in status.states if s.state == "predates" and not s.cell.study]
    for label, states in _by_label(predating).items():
        lines.append(
            f"{label}: {len(states)} recorded before numerics fingerprints (not counted): "
            f"{_cells_phrase(states, systems)}; `ledger run` trains them again"
        )
    other = [
        s
        for s in status.states
        if s.state == "other_config" and s.record is not None and not s.cell.study
    ]
    for label, states in _by_label(other).items():
        configs = sorted({s.record.config_hash[:12] for s in states if s.record})
        shown = ", ".join(configs[:3]) + (
            f" and {len(configs) - 3} more" if len(configs) > 3 else ""
        )
        lines.append(
            f"{label}: {len(states)} recorded under another config only (config {shown}): "
            f"{_cells_phrase(states, systems)}"
        )
    return "\n".join(lines)


def _by_label(states: list[CellState]) -> dict[str, list[CellState]]:
    out: dict[str, list[CellState]] = {}
    for s in states:
        out.setdefault(s.cell.row, []).append(s)
    return out


def _cells_phrase(states: list[CellState], systems: list[str]) -> str:
    """``seeds 3,4 of all 6 systems``, ``seed 4 of integro_de; seeds 0-4 of spiral_dde``."""
    by_system: dict[str, list[int]] = {}
    for s in states:
        by_system.setdefault(s.cell.system, []).append(s.cell.seed)
    by_seeds: dict[tuple[int, ...], list[str]] = {}
    for system, seeds in by_system.items():
        by_seeds.setdefault(tuple(sorted(seeds)), []).append(system)
    parts = []
    for seed_set, where in by_seeds.items():
        of = f"all {len(where)} systems" if len(where) == len(systems) > 1 else ", ".join(where)
        parts.append(f"seed{'s' if len(seed_set) > 1 else ''} {_seeds(seed_set)} of {of}")
    return "; ".join(parts)


def _seeds(seeds: tuple[int, ...]) -> str:
    if len(seeds) > 2 and seeds == tuple(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def tables(status: LedgerStatus, fmt: Literal["terminal", "markdown"]) -> str:
    """Table 3, the ablation and the Laplace-domain peers, each where the selection has cells
    of it."""
    from tasks.ledger.peers import peers_count, peers_table
    from tasks.ledger.views import ablation_table, ledger_table, table3_states
    from tasks.reports import render_table

    width = 160 if fmt == "terminal" else 100  # (Markdown has no width)
    parts = []
    table3 = table3_states(status)
    if table3:
        _, table = ledger_table(status)
        counted = status.counted(ablation=False)
        parts.append(render_table(table, fmt, width=width))
        older = sum(s.numerics == "older" for s in table3)
        gpu = sum(s.numerics == "gpu" for s in table3)
        parts.append(
            f"{len(counted)} of the {len(table3)} selected cells of Table 3 recorded. "
            f"Made by: {made_by(counted)}. {count_legend(older, gpu)}"
        )
    ablated = [s for s in status.states if s.cell.ablated]
    if ablated:
        counted = status.counted(ablation=True)
        parts.append(render_table(ablation_table(status), fmt, width=width))
        parts.append(
            f"{len(counted)} of the {len(ablated)} selected ablation cells recorded. "
            f"Made by: {made_by(counted)}."
        )
    if any(s.cell.peer for s in status.states):
        counted = status.counted(peers=True)
        parts.append(render_table(peers_table(status), fmt, width=width))
        parts.append(f"{peers_count(status)} Made by: {made_by(counted)}.")
    return "\n\n".join(parts)


def ledger_markdown(status: LedgerStatus) -> str:
    """Table 3 and the ablation from the counted records, as Markdown, with what made them
    (the ledger page's generated block)."""
    return tables(status, "markdown")


def readme_ledger(path: Path) -> str:
    """The ledger page's block: every cell of the paper profile, Table 3 and the ablation, from the
    ledger ``path`` (what ``nllab ledger table --readme`` writes)."""
    from tasks.ledger import ledger_scope, ledger_status, read_ledger

    scope = ledger_scope(ledger=path)
    return ledger_markdown(ledger_status(read_ledger(path, scope), scope.select(ablations=None)))


# -- the two protocols side by side (the fidelity page) ------------------------------------------
#: The ledger's profiles as the fidelity page names them.
PROTOCOLS = {"paper": "the reference protocol", "fair": "the fair protocol"}
_BASELINES = ("node", "anode", "latent_ode")


def protocols_markdown(path: Path, floors: dict[str, str] | None = None) -> str:
    """The finding of the fidelity page, from the ledger ``path``: one paragraph with the answer
    (is Neural Laplace best per system, under the reference protocol and under the fair one; do
    the reference protocol's baselines come into the paper's bands), the best method per system
    under each with the paired test between the two best, the copy floor beside it (``floors``:
    system → its seed-0 floor), then Table 3 under each protocol."""
    from tasks.ledger import best_per_system, ledger_scope, ledger_status, ledger_table, read_ledger
    from tasks.reports import PAPER_MAIN_TABLE, render_table

    statuses = {}
    for profile in PROTOCOLS:
        scope = ledger_scope(profile=profile, ledger=path)
        statuses[profile] = ledger_status(read_ledger(path, scope), scope.select(ablations=False))
    best = {p: {b.system: b for b in best_per_system(s)} for p, s in statuses.items()}
    paper_best: dict[str, tuple[str, float]] = {}
    for (method, system), figure in PAPER_MAIN_TABLE.items():
        if system not in paper_best or figure.mean < paper_best[system][1]:
            paper_best[system] = (method, figure.mean)
    lines = [_answer(statuses, best, paper_best), ""]
    head = ["system", "paper: best"]
    head += [f"{name} (`--profile {p}`): best, runner-up" for p, name in PROTOCOLS.items()]
    head.append("copy floor (seed 0)")
    lines += [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
    for system, (method, mean) in paper_best.items():
        cells = [system, f"{method} {mean:.4g}"]
        cells += [_best_cell(best[p].get(system)) for p in PROTOCOLS]
        cells.append((floors or {}).get(system, "–"))
        lines.append(f"| {' | '.join(cells)} |")
    lines += [
        "",
        "Best and runner-up by mean test RMSE over the recorded seeds (n); p: the paired t-test "
        "between them over the seeds both recorded (a seed's cells share their data set), "
        "two-sided; a best marked ✱ is ahead at the 5 % level. The copy floor: the lowest test "
        "RMSE the reference's NODE/ANODE can reach, their first prediction being the last "
        "observation (`benchmarks/copy_floor.py`).",
    ]
    for profile, name in PROTOCOLS.items():
        status = statuses[profile]
        counted = status.counted(ablation=False)
        lines += ["", f"### Table 3 by {name} (`--profile {profile}`)", ""]
        lines.append(render_table(ledger_table(status)[1], "markdown"))
        lines += ["", f"{len(counted)} of the {len(status.states)} cells recorded."]
    return "\n".join(lines)


def _best_cell(b) -> str:
    if b is None:
        return "–"
    mark = " ✱" if b.significant else ""
    text = f"{b.best} {b.best_mean:.4g} (n={b.best_n}){mark}"
    if b.runner_up is None:
        return text
    p = f"p = {b.p_value:.2g}" if b.p_value is not None else "no test"
    return f"{text}; {b.runner_up} {b.runner_up_mean:.4g} ({p}, {b.paired_seeds} paired)"


def _answer(statuses, best, paper_best) -> str:
    """The finding as a short list, one line per protocol, every figure counted from the
    records."""
    from tasks.reports import VERDICT_MARKS

    nl_paper = sum(m == "neural_laplace" for m, _ in paper_best.values())
    parts = [f"- The paper: Neural Laplace best on {nl_paper} of {len(paper_best)} systems."]
    for profile, name in PROTOCOLS.items():
        status, mine = statuses[profile], best[profile].values()
        complete = [b for b in mine if b.complete]
        counted = len(status.counted(ablation=False))
        nl = [b for b in complete if b.best == "neural_laplace"]
        sig = sum(b.significant for b in nl)
        others = sorted({b.best for b in complete if b.best != "neural_laplace"})
        if complete:
            result = (
                f"Neural Laplace is best on {len(nl)} of the {len(complete)} systems whose every "
                f"cell is recorded (ahead at the 5 % level on {sig})"
                + (f", {', '.join(others)} on the others" if others else "")
            )
        else:
            result = "no system has every method's seeds recorded yet" + interim_ranking(mine)
        verdicts = _baseline_verdicts(status)
        marks = ", ".join(
            f"{n} {_VERDICT_WORDS[v]} ({VERDICT_MARKS[v]})"
            for v, n in Counter(verdicts).most_common()
            if v
        )
        band = f"; the baselines' cells against the paper: {marks}" if marks else ""
        parts.append(
            f"- By {name} (`--profile {profile}`, {counted} of {len(status.states)} cells "
            f"recorded): {result}{band}."
        )
    return "\n".join(parts)


def interim_ranking(best: Iterable[BestOfSystem]) -> str:
    """Before any system is complete: the ranking on the seeds every method of a system has
    recorded (the same data sets for every method), where there are such seeds."""
    shared = [b for b in best if b.shared_best is not None]
    if not shared:
        return ""
    (first, *rest) = {b.shared_seeds for b in shared}
    seeds = (
        "the seeds they share"
        if rest
        else f"seed{'s' if len(first) > 1 else ''} " + ", ".join(map(str, first))
    )
    nl = sum(b.shared_best == "neural_laplace" for b in shared)
    others = [f"{b.shared_best} on {b.system}" for b in shared if b.shared_best != "neural_laplace"]
    return (
        f"; ranked on {seeds}, which every method has recorded on {len(shared)} "
        f"system{'s' if len(shared) > 1 else ''}: Neural Laplace best on {nl} of {len(shared)}"
        + (f" ({', '.join(others)})" if others else "")
    )


#: A verdict in words, beside its mark (:data:`tasks.reports.tables.VERDICT_MARKS`).
_VERDICT_WORDS = {
    "better": "better",
    "match": "within its band",
    "worse": "worse",
    "unclear": "unclear",
}


def _baseline_verdicts(status: LedgerStatus) -> list[str]:
    """The verdicts of the NODE, ANODE and Latent ODE cells of Table 3 with records."""
    from tasks.ledger import ledger_table

    results, _ = ledger_table(status)
    return [v for (m, _s), v in results.verdicts().items() if m in _BASELINES and v]
