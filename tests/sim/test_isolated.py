from shoal.backends.sim.isolated import isolated_jct
from shoal.backends.sim.profile import ProfileLibrary
from shoal.core.types import JobLimits


def test_a_share_beyond_the_profile_falls_back_to_the_largest_it_covers():
    app = ProfileLibrary("data/profiles-hetero").get("imagenet")
    limits = JobLimits(200, 12800, 16, 256, 4096)
    # 1/n of a large cluster can exceed every measured placement; the baseline must not fail.
    huge = isolated_jct(app, limits, 4096, 256, 4, "a100", 30.0)
    assert 0 < huge <= isolated_jct(app, limits, 4096, 8, 4, "a100", 30.0)
