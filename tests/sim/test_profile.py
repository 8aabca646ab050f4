import csv
import shutil

import pytest

from shoal.backends.sim.profile import ProfileLibrary


def test_measured_placements_are_reproduced_exactly(profiles, pollux_data):
    app = profiles.get("cifar10")
    with (pollux_data / "traces" / "cifar10" / "placements.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows[:: max(len(rows) // 25, 1)]:
        placement = tuple(int(c) for c in row["placement"])
        step, sync = app.step_and_sync(placement, float(row["local_bsz"]))
        # Several measurements of one (placement, batch) are averaged by interpolation order;
        # a unique one is returned as measured.
        same = [r for r in rows if r["placement"] == row["placement"]
                and r["local_bsz"] == row["local_bsz"]]
        if len(same) == 1:
            assert step == pytest.approx(float(row["step_time"]))
            assert sync == pytest.approx(float(row["sync_time"]))


def test_placements_are_identified_up_to_rotation(profiles):
    app = profiles.get("imagenet")
    assert app.step_and_sync((2, 4), 64) == app.step_and_sync((4, 2), 64)
    # Unmeasured shapes are interpolated and grow with scale.
    small = app.step_and_sync((4, 4, 4, 4), 64)[0]
    large = app.step_and_sync((4,) * 12, 64)[0]
    assert large > small > 0


def test_other_device_types_are_read_by_header(pollux_data, tmp_path):
    src = pollux_data / "traces" / "ncf"
    dst = tmp_path / "ncf"
    shutil.copytree(src, dst)
    for stem in ("placements", "scalability"):
        with (src / f"{stem}.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        fields = list(reversed(rows[0].keys()))  # columns in another order
        with (dst / f"{stem}-v100.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                row = dict(row)
                row["step_time"] = str(float(row["step_time"]) / 2)
                row["sync_time"] = str(float(row["sync_time"]) / 2)
                writer.writerow(row)
    app = ProfileLibrary(tmp_path).get("ncf")
    assert app.device_types == ["t4", "v100"]
    t4 = app.step_and_sync((2,), 64, "t4")
    v100 = app.step_and_sync((2,), 64, "v100")
    assert v100[0] == pytest.approx(t4[0] / 2)


def test_progress_and_gradient_statistics(profiles):
    app = profiles.get("bert")
    assert app.progress_at(0) == 0
    assert app.progress_at(1) < app.progress_at(2)
    sqr_lo, _var_lo = app.grad_stats(12, 0)
    sqr_mid, _var_mid = app.grad_stats(18, 0)  # interpolated between 12 and 24
    sqr_hi, _var_hi = app.grad_stats(24, 0)
    assert min(sqr_lo, sqr_hi) <= sqr_mid <= max(sqr_lo, sqr_hi)
    with pytest.raises(ValueError, match="outside profiled"):
        app.grad_stats(10_000, 0)
