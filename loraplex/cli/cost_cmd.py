"""`loraplex cost compare | table`: Tinker's per-token bill vs renting GPUs, for RL post-training.

Tinker bills tokens: prefill (every prompt token of every sample; multi-turn histories again
every turn), sampled tokens and trained tokens, at dated list prices. A self-hosted run pays
for rented GPUs by the hour, busy or not: prefill and training are compute-bound (FLOPs at
MFU), decode is bandwidth-bound (weights and KV cache streamed at MBU), environment latency
that training cannot hide leaves GPUs idle.

Presets: math_rl, code_rl, harbor_rl, swe_rl, osworld_rl, in two calibrations:
``seed-calibrated`` (default; a few unstated values solved so the published table is hit, a
regression test, not evidence) and ``physical`` (first-principles guesses). Every field can be
overridden by a flag (below) or a TOML file (``--config``) with optional top-level
``preset``/``calibration`` and tables ``[workload]``, ``[self_host]``, ``[tinker]``,
``[tinker_cached]`` (``tinker_cached = false`` drops the prefix-caching bill).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from loraplex.cost.calculator import Comparison, compare
from loraplex.cost.presets import PRESET_NAMES, SECTIONS, build_scenario
from loraplex.cost.price_sheets import get_price_sheet
from loraplex.cost.report import SELF_HOSTED_ITEMS, bill_items, comparison_to_dict
from loraplex.cost.seed_table import PUBLISHED, TableRow, comparison_table
from loraplex.cost.workloads import SelfHostSetup, TinkerSetup, Workload
from loraplex.errors import LoraplexError, user_error

_SECTION_CLASSES: dict[str, tuple[type, str]] = {
    "workload": (Workload, ""), "self_host": (SelfHostSetup, ""), "tinker": (TinkerSetup, ""),
    "tinker_cached": (TinkerSetup, "cached-"),
}
_CALIBRATIONS = ("seed-calibrated", "physical")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cost", help="per-token (Tinker) vs GPU-hour cost calculator", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="cost_command", required=True)

    cmp = verbs.add_parser("compare", help="both bills of one workload, winner and factor",
                           description=__doc__, usage="loraplex cost compare [--workload NAME] "
                           "[--calibration C] [--config FILE.toml] [--FIELD VALUE ...] "
                           "[--plot FILE.png] [--json]",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("--workload", choices=PRESET_NAMES, help="preset to start from")
    cmp.add_argument("--calibration", choices=_CALIBRATIONS, help="default: seed-calibrated")
    cmp.add_argument("--config", type=Path, metavar="FILE.toml", help="workload/setup file")
    cmp.add_argument("--plot", type=Path, metavar="FILE.png", help="draw both breakdowns")
    cmp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    for section, (cls, prefix) in _SECTION_CLASSES.items():
        group = cmp.add_argument_group(f"[{section}] fields")
        helps, hints = _attribute_help(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            group.add_argument(f"--{prefix}{f.name.replace('_', '-')}", dest=f"{section}.{f.name}",
                               default=argparse.SUPPRESS, metavar=_metavar(hints[f.name]),
                               help=helps.get(f.name, ""))
    cmp.set_defaults(func=_run_compare)

    table = verbs.add_parser("table", help="the five-row published comparison, reproduced",
                             description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    table.add_argument("--calibration", choices=_CALIBRATIONS, default="seed-calibrated")
    table.add_argument("--json", action="store_true", help="print a JSON list of rows")
    table.set_defaults(func=_run_table)


def _metavar(hint: Any) -> str:
    """``{a,b}`` for choices, ``N`` for integers, ``X`` for reals, ``TEXT`` otherwise."""
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(hint) if a is not type(None)] if is_union else [hint]
    if typing.get_origin(args[0]) is Literal:
        return "{" + ",".join(typing.get_args(args[0])) + "}"
    names = {bool: "{true,false}", int: "N", float: "X"}
    return names.get(args[0], "TEXT") + ("|none" if is_union else "")


def _attribute_help(cls: type) -> dict[str, str]:
    """Field help from the class docstring's ``Attributes:`` section (``a, b: text``)."""
    helps: dict[str, str] = {}
    current: list[str] = []
    for line in (cls.__doc__ or "").split("Attributes:")[-1].splitlines():
        m = re.match(r"\s{8}([a-z_, ]+):\s*(.*)", line)
        if m:
            current = [n.strip() for n in m.group(1).split(",")]
            for name in current:
                helps[name] = m.group(2)
        elif line.startswith(" " * 12) and current:
            for name in current:
                helps[name] += " " + line.strip()
    return {k: v.replace("%", "%%") for k, v in helps.items()}


def _run_compare(args: argparse.Namespace) -> int:
    try:
        comparison = compare(_scenario_from_args(args))
    except LoraplexError as exc:
        raise SystemExit(f"loraplex cost compare: {exc}") from None
    if args.json:
        print(json.dumps(comparison_to_dict(comparison), indent=2))
    else:
        _print_comparison(comparison)
    if args.plot:
        _plot(comparison, args.plot)
    return 0


def _scenario_from_args(args: argparse.Namespace) -> Any:
    file_values: dict[str, Any] = {}
    if args.config:
        import tomllib

        try:
            file_values = tomllib.loads(args.config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise user_error("--config", f"cannot read {args.config}: {exc}") from None
    unknown = sorted(set(file_values) - {"preset", "calibration", *SECTIONS})
    if unknown:
        raise user_error("--config", f"unknown top-level keys {unknown}")
    preset = args.workload or file_values.get("preset")
    calibration = args.calibration or file_values.get("calibration", "seed-calibrated")
    sections: dict[str, Any] = {k: file_values[k] for k in SECTIONS if k in file_values}
    for dest, value in vars(args).items():
        if "." in dest:
            section, name = dest.split(".", 1)
            current = sections.get(section)
            sections[section] = {**(current if isinstance(current, dict) else {}), name: value}
    if preset is None and "workload" not in sections:
        raise user_error("--workload", f"give a preset ({', '.join(PRESET_NAMES)}) or a "
                         "[workload] table in --config")
    return build_scenario(preset, calibration, sections)


def _usd(x: float | None) -> str:
    return "—" if x is None else f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def _print_comparison(c: Comparison) -> None:
    from rich.console import Console
    from rich.table import Table

    console, s, w = Console(), c.scenario, c.scenario.workload
    console.print(f"[bold]{w.name}[/] — {w.description}  ·  model {w.model}  ·  "
                  f"[bold]{s.calibration}[/] presets")
    for note in s.notes:
        console.print(f"  · {note}", style="dim")
    sheet = get_price_sheet(c.tinker.setup.price_sheet)
    mode = c.tinker.setup.billing_mode or sheet.billing_mode
    tinker = Table(title=f"Tinker ({sheet.name}, {mode} billing)", title_justify="left")
    tinker.add_column("item")
    tinker.add_column("uncached", justify="right")
    columns = [bill_items(c.tinker.bill)]
    if c.tinker_cached:
        tinker.add_column("w/ prefix caching", justify="right")
        columns.append(bill_items(c.tinker_cached.bill))
    for item in columns[0]:
        tinker.add_row(item.replace("_", " "), *(_usd(col[item]) for col in columns))
    totals = [c.tinker.total_usd] + ([c.tinker_cached.total_usd] if c.tinker_cached else [])
    tinker.add_row("[bold]total", *(f"[bold]{_usd(t)}" for t in totals))
    console.print(tinker)
    u = c.tinker.usage
    console.print(f"tokens: prefill {u.prefill_tokens / 1e6:,.1f}M, sampled "
                  f"{u.sampled_tokens / 1e6:,.1f}M, trained {u.trained_tokens / 1e6:,.1f}M"
                  + (f"; with prefix caching {c.tinker_cached.usage.cache_hit_tokens / 1e6:,.1f}M"
                     " of the prefill are hits" if c.tinker_cached else "")
                  + ("; storage rate not stated on this sheet (billed $0)"
                     if sheet.storage_usd_per_gb_month is None else ""), style="dim")
    console.print(_self_hosted_table(c))
    sh = c.self_hosted
    console.print(f"GPUs {sh.step.num_gpus} × {sh.hardware.name} (TP {sh.layout.tensor_parallel}"
                  f" × {sh.layout.num_replicas} replicas)  ·  wall-clock "
                  f"{sh.wall_clock_s / 3600:,.1f} h ({sh.step.wall_s:,.1f} s/step)  ·  "
                  f"utilization {sh.step.utilization:.0%}")
    winner = "Tinker" if c.winner == "tinker" else "self-hosted"
    console.print(f"[bold]winner: {winner}, {c.factor:.2f}× cheaper")
    _print_published(console, c)


def _self_hosted_table(c: Comparison) -> Any:
    from rich.table import Table

    sh, p = c.self_hosted, c.self_hosted.phases
    mode = c.scenario.self_host.mode
    table = Table(title=f"Self-hosted ({sh.hardware.name} at ${sh.usd_per_gpu_hour:.2f}/GPU-h, "
                        f"{mode})", title_justify="left")
    for name, justify in (("item", "left"), ("s/step", "right"), ("USD", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    seconds = {"prefill": p.prefill_s, "decode_weights": p.decode_weights_s,
               "decode_kv": p.decode_kv_s, "train": p.train_s, "env_idle": p.env_s,
               "fixed": p.fixed_s}
    usd = sh.breakdown_usd
    for item in SELF_HOSTED_ITEMS:
        label = "environment wait → idle" if item == "env_idle" else item.replace("_", " ")
        table.add_row(label, f"{seconds[item]:,.1f}", _usd(usd[item]))
    total = _usd(sh.total_usd)
    table.add_row("[bold]total (wall)", f"[bold]{sh.step.wall_s:,.1f}", f"[bold]{total}")
    return table


def _print_published(console: Any, c: Comparison) -> None:
    published = PUBLISHED.get(c.scenario.workload.name)
    if published is None or c.scenario.calibration != "seed-calibrated":
        return
    [row] = [r for r in comparison_table() if r.workload == published.workload]
    console.print(f"published: Tinker {_usd(published.tinker_usd)} (ours "
                  f"{row.ratio('tinker_usd'):.3f}×), self-hosted "
                  f"{_usd(published.self_hosted_usd)} (ours "
                  f"{row.ratio('self_hosted_usd'):.3f}×)")
    for d in row.known_deviations:
        console.print(f"[yellow]known deviation[/] ({d.cell}): {d.reason}")


def _run_table(args: argparse.Namespace) -> int:
    rows = comparison_table(args.calibration)
    if args.json:
        print(json.dumps([row.to_json() for row in rows], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"Tinker vs self-hosted, {args.calibration} presets (published in "
                        "parentheses; † known deviation)", title_justify="left")
    for col in ("workload", "model", "Tinker", "w/ prefix caching", "self-hosted", "winner"):
        table.add_column(col, justify="left" if col in ("workload", "model") else "right")
    for row in rows:
        table.add_row(*_table_cells(row))
    console.print(table)
    if args.calibration == "seed-calibrated":
        console.print("seed-calibrated: a few unstated inputs per row were solved to hit the "
                      "published cells (see `loraplex cost compare --workload NAME`)", style="dim")
    for row in rows:
        for d in row.known_deviations:
            console.print(f"[yellow]known deviation[/] {row.workload} {d.cell}: {d.reason}")
    return 0


def _table_cells(row: TableRow) -> tuple[str, ...]:
    c, pub = row.comparison, row.published

    def flag(name: str) -> str:
        return " [yellow]†[/]" if any(d.cell == name for d in row.known_deviations) else ""

    def cell(name: Any) -> str:
        ours, theirs = row.ours(name), getattr(pub, name)
        if ours is None:
            return "—"
        return f"{_dollars(ours)}{flag(name)}\n[dim]({_dollars(theirs)})[/]"

    def who(winner: str) -> str:
        return "Tinker" if winner == "tinker" else "self-hosted"

    return (row.workload, pub.model, cell("tinker_usd"), cell("tinker_cached_usd"),
            cell("self_hosted_usd"),
            f"{who(c.winner)} {c.factor:.2f}×{flag('factor')}\n"
            f"[dim]({who(pub.winner)} {pub.factor}×)[/]")


def _dollars(x: float | None) -> str:
    return "—" if x is None else f"${x:,.0f}"


_PLOT_COLORS = {"prefill": "C0", "cached_prefill": "C9", "sample": "C1", "train": "C2",
                "storage": "C4", "decode_weights": "C5", "decode_kv": "C6",
                "env_idle": "C7", "fixed": "C8"}


def _plot(c: Comparison, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: list[tuple[str, dict[str, float]]] = [("Tinker", bill_items(c.tinker.bill))]
    if c.tinker_cached:
        bars.append(("Tinker\nw/ prefix caching", bill_items(c.tinker_cached.bill)))
    bars.append(("self-hosted", c.self_hosted.breakdown_usd))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max(sum(items.values()) for _, items in bars)
    for x, (_, items) in enumerate(bars):
        bottom = 0.0
        for item, usd in items.items():
            if usd > 0:
                ax.bar(x, usd, bottom=bottom, color=_PLOT_COLORS[item])
                if usd > 0.03 * top:
                    ax.text(x, bottom + usd / 2, item.replace("_", " "), ha="center",
                            va="center", fontsize=7)
                bottom += usd
        ax.text(x, bottom, f"${bottom:,.0f}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(bars)), [label for label, _ in bars])
    ax.set_ylabel("USD per run")
    w = c.scenario.workload
    ax.set_title(f"{w.name} ({w.model}, {c.scenario.calibration}): "
                 f"{'Tinker' if c.winner == 'tinker' else 'self-hosted'} {c.factor:.2f}× cheaper",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
