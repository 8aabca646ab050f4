"""Tabulate cached policy-comparison reports, possibly from several source versions.

    .venv/bin/python bench/comparison_table.py --cache out/policy_runs \
        [--versions NEW,OLD...] [--fresh shoal [--fresh-versions K]] \
        [--base bench/results/policy_comparison_1-8.json] \
        [--json out/policy_comparison_table.json]

``bench/policy_comparison.py`` caches each simulation's report under the digest of shoal's
sources. After a change that leaves some policies' code paths untouched (e.g. a change to the
shoal policy only), their reports from an older version are still what the new code would
produce; this script builds one table from several versions, taking each (cluster, policy,
workload) from the first listed version that has it, and records which version every row
came from. Check one reused report against a rerun before relying on it. With ``--fresh``,
the policies it names come only from the first ``--fresh-versions`` versions (those whose code
is the changed one: later versions that only refactored must give identical reports). With
``--base``, a (cluster, policy) that has no report in the cache is taken whole from an earlier
output of this script, with the source version and machines it records.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

CLUSTERS = ("pollux-t4-64", "hetero-64", "hetero-256")
METRICS = [("avg JCT (s)", "avg_jct_s", "{:.0f}"), ("p99 JCT (s)", "p99_jct_s", "{:.0f}"),
           ("makespan (s)", "makespan_s", "{:.0f}"),
           ("device-h/job", "device_hours_per_job", "{:.2f}"),
           ("restarts/job", "restarts_per_job", "{:.2f}"), ("worst FTF", "worst_ftf", "{:.2f}")]


def _parse(name: str) -> tuple[str, str, str] | None:
    for cluster in CLUSTERS:
        if name.startswith(cluster + "-"):
            policy, _, rest = name[len(cluster) + 1:].partition("-workload-")
            return cluster, policy, "workload-" + rest.split("-")[0]
    return None


def cached_reports(cache: Path, version: str) -> Iterator[tuple[tuple[str, str, str], Path]]:
    """The reports cached for one source version, as ((cluster, policy, workload), path)."""
    for path in sorted((cache / version).glob("*.json")):
        key = _parse(path.stem)
        if key is not None:
            yield key, path


def collect(cache: Path, versions: list[str], fresh: str = "",
            fresh_versions: int = 1) -> dict[tuple[str, str, str], dict]:
    """Reports by (cluster, policy, workload); policies starting with ``fresh`` only from the
    first ``fresh_versions`` versions (those with the code that changed them)."""
    found: dict[tuple[str, str, str], dict] = {}
    for version in versions:
        for key, path in cached_reports(cache, version):
            if key in found:
                continue
            if fresh and key[1].startswith(fresh) and version not in versions[:fresh_versions]:
                continue
            summary = json.loads(path.read_text())["summary"]
            found[key] = {**summary, "source_version": version}
    return found


def from_base(base: dict, found: dict[tuple[str, str, str], dict]
              ) -> dict[tuple[str, str, str], dict]:
    """The rows of an earlier table (this script's JSON) for every (cluster, policy) that
    ``found`` has no row of, so that a policy's workloads never mix two tables."""
    have = {(cluster, policy) for cluster, policy, _ in found}
    return {(cluster, policy, workload): summary
            for cluster, policies in base.items() if cluster in CLUSTERS
            for policy, agg in policies.items() if (cluster, policy) not in have
            for workload, summary in agg["per_workload"].items()}


def environments(cache: Path, versions: list[str]) -> dict[str, list[dict]]:
    """Per source version, the machines and builds its reports were run on."""
    return {version: [json.loads(p.read_text())
                      for p in sorted((cache / version).glob("environment-*.json"))]
            for version in versions if (cache / version).is_dir()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="out/policy_runs")
    parser.add_argument("--versions", default="", help="source digests, newest first "
                        "(default: every directory of the cache, newest first)")
    parser.add_argument("--fresh", default="", help="policies with this name prefix are taken "
                        "from the first version only (e.g. shoal after a change to it)")
    parser.add_argument("--fresh-versions", type=int, default=1, help="how many of the first "
                        "versions --fresh policies may come from (default 1)")
    parser.add_argument("--base", default="", help="an earlier output of this script: a "
                        "(cluster, policy) with no report in the cache is taken from it")
    parser.add_argument("--json", default="out/policy_comparison_table.json")
    args = parser.parse_args()
    cache = Path(args.cache)
    versions = [v for v in args.versions.split(",") if v] or [
        p.name for p in sorted(cache.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        if p.is_dir()]
    found = collect(cache, versions, args.fresh, args.fresh_versions)
    earlier = json.loads(Path(args.base).read_text()) if args.base else {}
    found.update(from_base(earlier, found))
    console = Console(width=170)
    out: dict[str, dict] = {}
    for cluster in CLUSTERS:
        policies = list(dict.fromkeys(p for c, p, _ in sorted(found) if c == cluster))
        if not policies:
            continue
        table = Table(title=f"{cluster}: mean over workloads (worst FTF: maximum)")
        for title in ("policy", "workloads", *(m[0] for m in METRICS), "source"):
            table.add_column(title, justify="left" if title in ("policy", "source") else "right")
        out[cluster] = {}
        for policy in policies:
            rows = {w: s for (c, p, w), s in sorted(found.items()) if c == cluster and p == policy}
            agg = {key: (max if key == "worst_ftf" else statistics.fmean)(
                [r[key] for r in rows.values()]) for _, key, _ in METRICS}
            agg["workloads"] = sorted(rows, key=lambda w: int(w.split("-")[1]))
            agg["per_workload"] = rows
            out[cluster][policy] = agg
            table.add_row(policy, ",".join(w.split("-")[1] for w in agg["workloads"]),
                          *(f.format(agg[key]) for _, key, f in METRICS),
                          ",".join(sorted({r["source_version"] for r in rows.values()})))
        console.print(table)
        for base in ("pollux", "sia"):
            if "shoal" in out[cluster] and base in out[cluster]:
                shoal, other = out[cluster]["shoal"]["per_workload"], out[cluster][base][
                    "per_workload"]
                common = sorted(set(shoal) & set(other), key=lambda w: int(w.split("-")[1]))
                ratios = [shoal[w]["avg_jct_s"] / other[w]["avg_jct_s"] for w in common]
                console.print(f"  shoal / {base} avg JCT per workload: "
                              f"{', '.join(f'{r:.3f}' for r in ratios)} "
                              f"(mean {statistics.fmean(ratios):.3f})")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    used = sorted({r["source_version"] for r in found.values()})
    machines = {**{v: e for v, e in earlier.get("environments", {}).items() if v in used},
                **environments(cache, used)}
    path.write_text(json.dumps({**out, "environments": machines}, indent=1))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
