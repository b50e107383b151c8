"""The benchmark suite: every committed result regenerated in one sequential run, each with the
settings of the committed file (`manifest.py`), quick entries first.

    python -m benchmarks suite                      # everything: ~8.5 h on a 2-core AVX2 box
    python -m benchmarks suite --list               # entries, estimates, what each installs
    python -m benchmarks suite --dry-run            # the commands, run nothing
    python -m benchmarks suite --only engine_train,packed_gemm --out /tmp/results
    python -m benchmarks suite --skip multiplex,real_model_rl
    python -m benchmarks suite --check              # parse every entry's arguments, run nothing

Entries run one at a time (never two at once: they share the cores they measure), each as
``python -m benchmarks NAME ARGS --out DIR`` in its own process group, its stdout and stderr to
``.scratch/suite/<start time>/<result>.log``. An entry that fails, or exits 0 without writing
its results file, is recorded and the next one runs. At the end the suite writes
``suite.{json,md}`` into ``--out`` through the harness (revision, load average and GEMM probe
at start and end, per entry: seconds, exit code, status) and exits 1 unless every selected entry
wrote its result. An entry whose benchmark is not in this checkout (on another branch) is
reported as missing, not run. Ctrl-C stops the running entry (its servers included) and writes
the summary of what ran.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import SCRATCH
from benchmarks.harness import cli
from benchmarks.suite.manifest import ENTRIES, Entry, available
from benchmarks.suite.runner import Outcome, display, duration, ordered, run_all

say = functools.partial(print, flush=True)


def select(only: str | None, skip: str | None) -> list[Entry]:
    """The manifest's entries named by ``--only`` (all if None) less those named by ``--skip``,
    quick ones first.

    Raises:
        ValueError: a name that is no entry's result stem.
    """
    stems = [entry.stem for entry in ENTRIES]
    named = {part for arg in (only, skip) if arg for part in arg.split(",") if part}
    unknown = sorted(named - set(stems))
    if unknown:
        raise ValueError(f"no suite entry {', '.join(unknown)} (entries: {', '.join(stems)})")
    keep = set(only.split(",")) if only else set(stems)
    drop = set(skip.split(",")) if skip else set()
    return ordered([entry for entry in ENTRIES if entry.stem in keep - drop])


def listing(entries: list[Entry], out: Path) -> str:
    lines = []
    for i, entry in enumerate(entries, 1):
        state = "" if available(entry) else f"  [missing here: on branch {entry.elsewhere}]"
        lines.append(f"{i:2d}. {entry.stem}  ~{entry.minutes:g} min{state}")
        lines.append(f"      {display(entry, out)}")
        if entry.needs:
            lines.append(f"      needs: {entry.needs}")
    lines.append(f"{len(entries)} entries, ~{duration(60 * sum(e.minutes for e in entries))} "
                 "estimated on a shared 2-core AVX2 machine (first-run installs not included)")
    return "\n".join(lines)


def dry_run(entries: list[Entry], out: Path) -> str:
    """The commands, one a line, in the order they would run; a missing one commented out."""
    return "\n".join(display(entry, out) if available(entry) else
                     f"# not in this checkout (branch {entry.elsewhere}): {display(entry, out)}"
                     for entry in entries)


def check(entries: list[Entry], out: Path) -> int:
    """Parse every entry's arguments with its benchmark's parser; 1 if any fails to."""
    from benchmarks.suite.arguments import check_all

    verdicts = check_all(entries, out)
    for stem, passed, verdict in verdicts:
        say(f"{'ok  ' if passed else 'FAIL'} {stem:32s} {verdict}")
    return 0 if all(passed for _, passed, _ in verdicts) else 1


def run(entries: list[Entry], out: Path, argv: list[str]) -> int:
    from benchmarks.harness.result import Run
    from benchmarks.harness.writer import write
    from benchmarks.suite.report import markdown, payload

    log_dir = SCRATCH / "suite" / time.strftime("%Y%m%d-%H%M%S")
    say(f"suite: {len(entries)} entries, ~{duration(60 * sum(e.minutes for e in entries))} "
        f"estimated; results into {out}, logs into {log_dir}")
    record = Run("suite")
    outcomes: list[Outcome] = run_all(entries, out, log_dir, say)
    result = record.finish(payload(entries, outcomes, out, log_dir, argv))
    write(result, markdown(result), out)
    not_ok = result.payload["not_ok"]
    say(f"suite: {len(entries) - len(not_ok)} of {len(entries)} entries wrote their results in "
        f"{duration(result.wall_s)}; " + (f"not ok: {', '.join(not_ok)}" if not_ok
                                            else "all ok") + f"; summary {out}/suite.md")
    return 1 if not_ok else 0


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--only", help="comma-separated result stems to run (default: all)")
    parser.add_argument("--skip", help="comma-separated result stems not to run")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument("--check", action="store_true",
                        help="parse each entry's arguments with its benchmark's parser and exit")
    args = parser.parse_args(argv)
    try:
        entries = select(args.only, args.skip)
    except ValueError as exc:
        parser.error(str(exc))
    out = args.out.resolve()
    if args.list or args.dry_run:
        say(listing(entries, out) if args.list else dry_run(entries, out))
        return 0
    if args.check:
        return check(entries, out)
    return run(entries, out, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
