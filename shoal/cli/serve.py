"""``shoal serve-sim``: place models and simulate serving a trace under named policies."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from shoal.cli.console import output_console
from shoal.serve.evaluate import POLICIES, ServeSimConfig, build_problem, run_policy
from shoal.spec.errors import SpecError


@click.command("serve-sim")
@click.option("--trace", default="code", show_default=True,
              help="Azure trace name (code, conv) or a CSV with TIMESTAMP,ContextTokens,"
                   "GeneratedTokens.")
@click.option("--models", default=8, show_default=True, type=int, help="number of models")
@click.option("--devices", default="v100:16", show_default=True,
              help="TYPE:COUNT[@PER_NODE][,...] (e.g. v100:32, t4:16@4,a100:8) or a cluster preset")
@click.option("--slo-scale", default=5.0, show_default=True, type=float,
              help="deadline = scale x the request's latency alone on one device")
@click.option("--cv", default=None, type=float,
              help="re-time arrivals as Gamma(cv) per minute of the trace (default: raw times)")
@click.option("--rate-scale", default=1.0, show_default=True, type=float,
              help="multiply the trace's arrival rate (time compression)")
@click.option("--policy", default="shoal,selective-replication", show_default=True,
              help=f"comma-separated, from: {', '.join(POLICIES)}")
@click.option("--mix", default="opt-6.7b", show_default=True,
              help="comma-separated model architectures cycled over the models")
@click.option("--max-batch", default=4, show_default=True, type=int)
@click.option("--max-wait", "max_wait_s", default=0.0, show_default=True, type=float)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--duration", "duration_s", default=None, type=float,
              help="keep only the first seconds of the (rate-scaled) trace")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="write results JSON")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False), help="write a PNG figure")
def serve_sim_command(trace: str, models: int, devices: str, slo_scale: float, cv: float | None,
                      rate_scale: float, policy: str, mix: str, max_batch: int,
                      max_wait_s: float, seed: int, duration_s: float | None, json_out: str | None,
                      plot_out: str | None) -> None:
    """Place MODELS on DEVICES with each policy and simulate the trace request by request."""
    config = ServeSimConfig(trace=trace, models=models, devices=devices, slo_scale=slo_scale,
                            cv=cv, rate_scale=rate_scale, mix=tuple(mix.split(",")),
                            max_batch=max_batch, max_wait_s=max_wait_s, seed=seed,
                            duration_s=duration_s)
    names = [p.strip() for p in policy.split(",") if p.strip()]
    try:
        unknown = [n for n in names if n not in POLICIES]
        if unknown or not names:
            raise SpecError(f"unknown policy {unknown or names}; choose from "
                            f"{', '.join(POLICIES)}", field="policy")
        results = {}
        for name in names:
            results[name] = run_policy(name, build_problem(config), config)
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    table = Table(title=f"serve-sim: {trace}, {models} models, {devices}, SLO x{slo_scale}")
    for column in ("policy", "SLO attainment", "p50 (s)", "p99 (s)", "throughput/s", "devices"):
        table.add_column(column)
    for name, res in results.items():
        s = res["summary"]
        table.add_row(name, f"{100 * s['slo_attainment']:.2f}%", f"{s['p50_latency_s']:.3f}",
                      f"{s['p99_latency_s']:.3f}", f"{s['throughput_rps']:.2f}", str(s["devices"]))
    output_console().print(table)
    if json_out:
        payload = {"config": {**config.__dict__, "mix": list(config.mix)},
                   "policies": {n: {k: v for k, v in r.items() if k != "latency_s"}
                                for n, r in results.items()}}
        Path(json_out).write_text(json.dumps(payload, indent=2))
    if plot_out:
        from shoal.serve.plots import plot_policies

        plot_policies(results, plot_out)


@click.command("loadgen")
@click.argument("url")
@click.option("--trace", required=True,
              help="CSV of arrivals: an Azure trace (TIMESTAMP column, or the names code / conv) "
                   "or any CSV with an arrival_s column (seconds).")
@click.option("--duration", "duration_s", default=30.0, show_default=True, type=float,
              help="send the arrivals of the first seconds of the (rate-scaled) trace")
@click.option("--rate-scale", default=1.0, show_default=True, type=float,
              help="multiply the trace's arrival rate (time compression)")
@click.option("--slo", "slo_s", default=0.25, show_default=True, type=float,
              help="latency SLO in seconds; deadline = scheduled arrival + SLO")
@click.option("--max-requests", default=5000, show_default=True, type=int,
              help="send at most this many requests")
@click.option("--json", "json_out", type=click.Path(dir_okay=False),
              help="write the summary and per-request latencies as JSON")
def loadgen_command(url: str, trace: str, duration_s: float, rate_scale: float, slo_s: float,
                    max_requests: int, json_out: str | None) -> None:
    """Replay a trace's arrival times open-loop against a model server or router at URL
    (loopback only) and report SLO attainment and latency percentiles."""
    from shoal.serve.loadgen import run_loadgen

    try:
        result = run_loadgen(url, trace, slo_s, duration_s, rate_scale, max_requests)
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    s = result.summary
    table = Table(title=f"loadgen: {url}, {trace}, x{rate_scale}, SLO {slo_s * 1000:g} ms")
    for column in ("requests", "offered/s", "SLO attainment", "p50 (ms)", "p99 (ms)",
                   "rejected (503)", "errors", "mean batch", "p99 send lag (ms)"):
        table.add_column(column)
    table.add_row(str(s["requests"]), f"{s['offered_rps']:.1f}",
                  f"{100 * s['slo_attainment']:.2f}%", f"{1000 * s['p50_latency_s']:.1f}",
                  f"{1000 * s['p99_latency_s']:.1f}", str(s["rejected_503"]), str(s["errors"]),
                  f"{s['mean_batch_size']:.2f}", f"{1000 * s['p99_send_lag_s']:.1f}")
    output_console().print(table)
    if json_out:
        payload = {"url": url, "trace": trace, "duration_s": duration_s,
                   "rate_scale": rate_scale, "slo_s": slo_s, **result.as_json()}
        Path(json_out).write_text(json.dumps(payload, indent=2))
