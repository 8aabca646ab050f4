"""bench/run_all.py: every benchmark it runs exists and takes the output option it is given."""

import re
import shutil
import subprocess

from tests.sim.bench_scripts import BENCH, load


def _suite():
    return load("run_all").BENCHMARKS


def test_each_benchmark_script_accepts_its_output_option():
    benchmarks = _suite()
    assert {b.suite for b in benchmarks} == {"quick", "full"}
    assert len({b.name for b in benchmarks}) == len(benchmarks)
    for bench in benchmarks:
        source = (BENCH / bench.script).read_text()
        options = set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', source))
        assert bench.json_flag in options, (bench.name, sorted(options))
        given = {arg for arg in bench.args if arg.startswith("--")}
        assert given <= options, (bench.name, given - options)


def test_the_policy_variants_patch_applies_to_this_source():
    """docs/scheduling.md tells readers to `git apply` it to reproduce the variants tried
    (checked against the working tree, so local edits of the policy can make this fail)."""
    git = shutil.which("git")
    assert git, "git is needed to apply bench/policy_variants.patch"
    done = subprocess.run([git, "apply", "--check", str(BENCH / "policy_variants.patch")],
                          cwd=BENCH.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
