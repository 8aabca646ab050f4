from __future__ import annotations

import pytest

from shoal.serve.hardware import Device, Hardware

# A device of speed 1 for work-based latency models (100 TFLOP/s = speed 1).
UNIT = Hardware("unit", 100.0, 16.0, 100.0, 100.0, 100.0, 10.0)


@pytest.fixture
def unit_devices() -> list[Device]:
    return [Device(i, 0, UNIT) for i in range(8)]
