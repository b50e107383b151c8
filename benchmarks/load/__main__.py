"""Load benchmark: many official-SDK clients against one `loraplex serve` (builtin:tiny), then one
flooding tenant beside a few normal ones, then OpenAI-API clients beside them: errors, latency
per op kind, server RSS over time, and the normal tenants' slowdown under each load.

    python -m benchmarks.load [--soak-s 120] [--clients 32] [--flood-s 60] [--out DIR]
    python -m benchmarks.load --smoke --out /tmp/load      # end to end in ~40 s (2 cores)

1. **Soak**: ``clients`` SDK clients, each its own ``tml-`` key and session; even ones train
   (forward_backward + optim_step pipelined, every 5th iteration an ephemeral sampler save +
   sample, every 10th a named save_weights_for_sampler + create_sampling_client + sample;
   iteration 0 does all), odd ones sample the base model (2-4 samples, 4-16 new tokens), for
   ``soak_s``. Every op's latency and outcome is recorded. They run as ``clients_per_process``
   SDK clients (threads) per process: one process per client would cost 32 SDK imports (≈ 2.5
   CPU-s each, a minute of both cores) and ≈ 32 × 100 MB, and its 32 interpreters would
   fight the server for the two cores; one process for all would put 32 SDK event loops under
   one GIL. Eight per process keeps each client a real SDK client with its own session,
   heartbeat and connection pool, at four imports.
2. **Expiry**: the clients stop; half of each role close their session, the other half just
   exit (their heartbeats stop). The run waits until the server's idle timeout has released
   the abandoned sessions (heartbeat bound + ``session_idle_s`` + housekeeping) and, unless
   ``--no-fetched-grace``, until fetched futures are dropped (`FETCHED_GRACE_S` after the last
   fetch), then reads the final RSS. Goal: final ≤ 1.1 × the post-warm-up RSS (every client
   has run each op kind once).
3. **Flood**: ``steady_tenants`` SDK tenants in a closed training loop; baseline window A (half
   of ``baseline_s``), then one flooding tenant (`load/flood.py`: raw HTTP, its queue kept at
   the in-flight limit, every 429 resubmitted at once: why that is the worst case is in its
   docstring) for ``flood_s``, its queue drained, baseline window B. Goal: normal tenants'
   step p50 during the flood ≤ 2 × their baseline p50 (A and B pooled).
4. **OpenAI**: the same normal tenants go on while ``openai_clients`` official ``openai``
   clients (`load/openai_clients.py`: a quarter each of completions, streamed completions, chat and
   streamed chat, closed loops, their own keys) sample the base model for ``openai_s``; they
   leave, baseline window C. Goals: no errors, normal tenants' step p50 ≤ 2 × their baseline
   (B and C pooled), server RSS after C ≤ 1.1 × RSS just before the clients came.

The server's RSS (``VmRSS`` of its process tree) is sampled every ``rss_interval_s``. Load
average and the GEMM probe (`probe.py`) are recorded at start and end. Writes
``load.{json,md,png}`` (`load/report.py`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tqdm import tqdm

from benchmarks import SCRATCH
from benchmarks.harness import cli
from benchmarks.harness.result import Run, git_state
from benchmarks.harness.workers import Workers
from benchmarks.harness.writer import write
from benchmarks.load.phases import (
    SETUP_TIMEOUT_S,
    Recorder,
    Timeline,
    expiry_phase,
    flood_phase,
    openai_phase,
    phase_spans,
    soak_phase,
)
from benchmarks.load.server import MODEL_NAME, MODEL_SOURCE, OBSERVER_KEY, RssSampler, load_server
from benchmarks.load.settings import SDK_HEARTBEAT_S, SMOKE, Settings
from benchmarks.load.summary import error_summary, goals, per_kind, rss_around, rss_summary

HERE = Path(__file__).resolve().parent
CLIENT_SCRIPT, FLOOD_SCRIPT, OPENAI_SCRIPT = (HERE / "client.py", HERE / "flood.py",
                                              HERE / "openai_clients.py")


def run(settings: Settings, scratch: Path) -> dict[str, Any]:
    """Start the workers and the server, run the three phases; the measured part of the
    result (times still wall clock)."""
    run_id, started = time.strftime("%H%M%S"), time.time()
    recorder = Recorder()
    workers = Workers(scratch / "logs", recorder.add)
    names = [f"soak-proc-{p}" for p in range(settings.num_processes)]
    try:
        for name in names:  # they import the SDK while the server starts
            workers.spawn(name, CLIENT_SCRIPT)
        tqdm.write("starting loraplex serve and the client processes")
        with load_server(settings.server(), scratch / "data", SCRATCH / "load-models") as server:
            workers.wait_all(names, "started", SETUP_TIMEOUT_S)
            origin = time.time()
            rss = RssSampler(server.pid, settings.rss_interval_s).start()
            timeline = Timeline(server.pid)
            soak = soak_phase(settings, server, workers, recorder, timeline, run_id)
            tqdm.write(f"soak: {len(recorder.ops)} ops; waiting for sessions to expire")
            # The flood phase's processes import the SDK while the server sits idle.
            workers.spawn("steady", CLIENT_SCRIPT)
            workers.spawn("flood", FLOOD_SCRIPT)
            workers.spawn("openai", OPENAI_SCRIPT)
            expiry = expiry_phase(settings, workers, recorder, timeline, soak)
            workers.wait_all(["steady", "flood", "openai"], "started", SETUP_TIMEOUT_S)
            stats_expired = server.stats(OBSERVER_KEY)
            flood = flood_phase(settings, server, workers, recorder, timeline, run_id)
            openai = openai_phase(settings, server, workers, recorder, timeline, run_id)
            samples = rss.stop()
    finally:
        workers.close()
    return {"origin": origin, "startup_s": origin - started, "recorder": recorder,
            "timeline": timeline.phases, "soak": soak, "expiry": expiry, "flood": flood,
            "openai": openai, "rss_samples": samples,
            "stats_after_expiry": {k: stats_expired.get(k) for k in
                                   ("engine_calls", "pending_futures", "queued_ops")}}


def soak_section(settings: Settings, measured: dict[str, Any]) -> dict[str, Any]:
    """Who ran, how many ops, latency per op kind, errors, client CPU."""
    soak, recorder = measured["soak"], measured["recorder"]
    phase = next(p for p in measured["timeline"] if p["name"] == "soak")
    ops, span = recorder.phase_ops("soak"), phase["end"] - phase["start"]
    return {"clients": len(soak["specs"]), "processes": settings.num_processes,
            "closed_sessions": sorted(soak["closed"]),
            "abandoned_sessions": sorted(s.name for s in soak["specs"]
                                         if s.name not in soak["closed"]),
            "duration_s": span, "num_ops": len(ops), "ops_per_s": len(ops) / span,
            "ops": per_kind(ops), "errors": error_summary(ops),
            "client_cpu_s": soak["client_cpu_s"], "client_cpu_share": soak["client_cpu_share"]}


def rss_section(settings: Settings, measured: dict[str, Any]) -> dict[str, Any]:
    """RSS levels; post-warm-up is when the last soak client finished its first iteration
    (the soak's end if one never did)."""
    origin, recorder, expiry = measured["origin"], measured["recorder"], measured["expiry"]
    soak_end = next(p["end"] for p in measured["timeline"] if p["name"] == "soak")
    warm = [recorder.warm.get(s.name) for s in measured["soak"]["specs"]]
    warm_at = max(w for w in warm if w is not None) if all(warm) else soak_end
    rss = rss_summary(measured["rss_samples"], warm_at=warm_at, soak_end=soak_end,
                      expired_at=expiry["expired_at"], final_at=expiry["final_at"],
                      span_s=settings.settle_s)
    return {**rss, "warm_at_s": warm_at - origin, "warmup_complete": all(warm),
            # Adapter release plans the server ran (one may release several sessions): more
            # after the wait than at stop means the idle timeout released the abandoned ones.
            "release_plans_at_stop": measured["soak"]["release_plans_at_stop"],
            "release_plans_after_wait":
                (measured["stats_after_expiry"]["engine_calls"] or {}).get("release", 0),
            "expired_at_s": expiry["expired_at"] - origin,
            "final_at_s": expiry["final_at"] - origin,
            "waited_for_fetched_grace_s": expiry["fetched_grace_s"]}


def openai_section(settings: Settings, measured: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI phase's summary and the server's RSS around it (before: the end of
    baseline B; after: the end of baseline C, the clients gone)."""
    spans = phase_spans(measured["timeline"])
    rss = rss_around(measured["rss_samples"], load_start=spans["openai"][0],
                     after_end=spans["baseline_c"][1], span_s=settings.settle_s)
    return {**measured["openai"], "rss": rss}


def raw_section(measured: dict[str, Any]) -> dict[str, Any]:
    """Every op, RSS sample and flooder progress report, seconds since the server was up."""
    origin, recorder = measured["origin"], measured["recorder"]
    return {
        # An op's phase follows from its t0 and "phases"; ok is false for a failure.
        "op_columns": ["t0_s", "latency_ms", "kind", "client", "ok"],
        "ops": [[round(op["t0"] - origin, 2), round(1000 * (op["t1"] - op["t0"]), 1),
                 op["k"], op["c"], op["ok"]] for op in recorder.ops],
        "rss_columns": ["t_s", "rss_mib"],
        "rss": [[round(t - origin, 2), round(b / 2**20, 1)] for t, b in measured["rss_samples"]],
        "flood_progress": [{**p, "t": round(p["t"] - origin, 2)}
                           for p in recorder.flood_progress],
    }


def assemble(settings: Settings, measured: dict[str, Any]) -> dict[str, Any]:
    """The result dict: summaries, goals, and the raw records (times relative to the moment
    the server was up)."""
    soak, rss, flood = (soak_section(settings, measured), rss_section(settings, measured),
                        measured["flood"])
    flooder, openai = flood["flooder"], openai_section(settings, measured)
    num_errors = (soak["errors"]["count"] + flood["normal_errors"]["count"]
                  + flooder["failed"] + sum(flooder["other_http"].values())
                  + openai["normal_errors"]["count"] + openai["client_errors"]["count"])
    return {
        "settings": asdict(settings), "startup_s": measured["startup_s"],
        "server_env": settings.server().environment(),
        "phases": [{"name": p["name"], "start_s": p["start"] - measured["origin"],
                    "end_s": p["end"] - measured["origin"],
                    "server_cpu_share": p["server_cpu_share"],
                    "machine_busy_share": p["machine_busy_share"]}
                   for p in measured["timeline"]],
        "soak": soak, "rss": rss, "stats_after_expiry": measured["stats_after_expiry"],
        "flood": flood, "openai": openai, "num_errors": num_errors,
        "goals": goals(num_errors, rss, flood["normal"]["ratio"], openai["normal"]["ratio"],
                       openai["rss"]["after_over_before"],
                       rss_tolerance=settings.rss_tolerance, ratio_limit=settings.ratio_limit),
        "raw": raw_section(measured),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser(__doc__)
    p.add_argument("--smoke", action="store_true",
                   help="4 clients, 3 s soak, 3 s flood, short timeouts (end-to-end check)")
    p.add_argument("--clients", type=int, help="soak clients (default 32)")
    p.add_argument("--clients-per-process", type=int, help="SDK clients per process (8)")
    p.add_argument("--soak-s", type=float, help="soak duration (default 120)")
    p.add_argument("--steady-tenants", type=int, help="normal tenants under flood (4)")
    p.add_argument("--flood-s", type=float, help="flood window (default 60)")
    p.add_argument("--baseline-s", type=float,
                   help="baseline windows together, half before and half after the flood "
                        "(default: --flood-s)")
    p.add_argument("--flood-concurrency", type=int, help="flooder submitters (64)")
    p.add_argument("--openai-clients", type=int, help="OpenAI-API clients (default 16)")
    p.add_argument("--openai-s", type=float, help="OpenAI window (default 60)")
    p.add_argument("--flood-retry-s", type=float,
                   help="flooder's pause before resubmitting a 429 (default 0)")
    p.add_argument("--session-idle-s", type=float, help="server session idle timeout (30)")
    p.add_argument("--housekeeping-s", type=float, help="server housekeeping interval (2)")
    p.add_argument("--no-fetched-grace", action="store_true",
                   help="final RSS right after sessions expire, without waiting for fetched "
                        "futures to be dropped")
    p.add_argument("--threads", type=int, help="server torch threads (default 1; 0: torch's)")
    p.add_argument("--keep-scratch", type=Path,
                   help="put the server data dir and worker logs here and keep them")
    args = p.parse_args(argv)
    if args.session_idle_s is not None and args.session_idle_s < SDK_HEARTBEAT_S + 2:
        p.error(f"--session-idle-s must exceed the SDK's {SDK_HEARTBEAT_S:g} s heartbeat "
                "period by a margin (≥ 12), or live sessions are released between heartbeats")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    settings = cli.overridden(
        SMOKE if args.smoke else Settings(), clients=args.clients,
        clients_per_process=args.clients_per_process, soak_s=args.soak_s,
        steady_tenants=args.steady_tenants, flood_s=args.flood_s, baseline_s=args.baseline_s,
        flood_concurrency=args.flood_concurrency, flood_retry_s=args.flood_retry_s,
        session_idle_s=args.session_idle_s, housekeeping_s=args.housekeeping_s,
        openai_clients=args.openai_clients, openai_s=args.openai_s)
    if args.no_fetched_grace:
        settings = replace(settings, wait_fetched_grace=False)
    if args.threads is not None:
        settings = replace(settings, threads=args.threads or None)
    return settings


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # Imported after parsing, so that --help needs neither torch nor matplotlib.
    from benchmarks.load.report import figure, markdown

    settings = settings_from(args)
    # SIGTERM unwinds like Ctrl-C, so the server and the client processes are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_record = Run("load")
    tqdm.write(f"probe: {run_record.start.probe}")
    if args.keep_scratch:
        args.keep_scratch.mkdir(parents=True, exist_ok=True)
        measured = run(settings, Path(tempfile.mkdtemp(prefix="load-", dir=args.keep_scratch)))
    else:
        with tempfile.TemporaryDirectory(prefix="loraplex-load-") as scratch:
            measured = run(settings, Path(scratch))
    payload = {"smoke": args.smoke, "git": git_state(), "cores": os.cpu_count(),
               **assemble(settings, measured)}
    result = run_record.finish(payload, model=f"{MODEL_NAME}={MODEL_SOURCE}")
    write(result, markdown(result, "load.png"), args.out, figure=figure(payload))
    verdict = ", ".join(f"{name} {'PASS' if g['pass'] else 'FAIL'}"
                        for name, g in payload["goals"].items())
    tqdm.write(f"wrote {args.out}/load.{{json,md,png}} in {result.wall_s:.0f} s: {verdict}")
    return payload


if __name__ == "__main__":
    main()
