from pathlib import Path

import pytest

from shoal.backends.sim.isolated import isolated_jct
from shoal.backends.sim.profile import ProfileLibrary
from shoal.backends.sim.run import simulate
from shoal.core.types import JobLimits
from shoal.policy import make_policy
from shoal.spec import JobSpec, parse_cluster

HETERO_PROFILES = Path(__file__).resolve().parents[2] / "data" / "profiles-hetero"


def test_a_share_beyond_the_profile_falls_back_to_the_largest_it_covers():
    app = ProfileLibrary(HETERO_PROFILES).get("imagenet")
    limits = JobLimits(200, 12800, 16, 256, 4096)
    # 1/n of a large cluster can exceed every measured placement; the baseline must not fail.
    huge = isolated_jct(app, limits, 4096, 256, 4, "a100", 30.0)
    assert 0 < huge <= isolated_jct(app, limits, 4096, 8, 4, "a100", 30.0)


def test_on_a_mixed_cluster_the_fair_share_is_one_nth_of_every_type_on_its_best_type():
    profiles = ProfileLibrary(HETERO_PROFILES)
    cluster = parse_cluster({
        "name": "mixed", "device_types": [{"name": "t4", "memory_gb": 16},
                                          {"name": "a100", "memory_gb": 80}],
        "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 2},
                  {"device_type": "a100", "devices_per_node": 4, "count": 1}],
    })
    job = JobSpec(name="alone", application="cifar10", batch_size=128, target_epochs=2)
    result = simulate([job], make_policy("fifo"), cluster, profiles)
    record = result.records[0]
    app = profiles.get("cifar10")
    on = {t: isolated_jct(app, record.limits, 128, n, 4, t, 30.0, 2)
          for t, n in (("t4", 8), ("a100", 4))}
    # Alone (contention 1), its share is the whole cluster: 8 T4 or 4 A100, whichever is faster.
    assert result.isolated_jct["alone"] == pytest.approx(min(on.values()))
    assert on["t4"] != pytest.approx(on["a100"])
