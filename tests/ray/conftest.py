"""A two-node Ray cluster on loopback for the whole session, stopped at the end, also on failure.

Node 127.0.0.2 (head) offers one ``cpu`` and one ``fast`` device, node 127.0.0.3 one ``cpu``
and one ``slow`` device (custom resources ``shoal:<type>``): a two-replica ``cpu`` job must
span both nodes, and each node has a type the other lacks.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ray.cluster import RAY_ENV, LoopbackCluster

HEAD_RESOURCES = {"shoal:cpu": 1.0, "shoal:fast": 1.0}
WORKER_RESOURCES = {"shoal:cpu": 1.0, "shoal:slow": 1.0}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LoopbackCluster]:
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in RAY_ENV.items():  # for drivers: this process and the services
            patch.setenv(key, value)
        cluster = LoopbackCluster(HEAD_RESOURCES, WORKER_RESOURCES)
        try:
            yield cluster.start()
        finally:
            cluster.stop()
