"""On the Ray backend, a service listening on every interface starts its serve jobs' routers
on every interface too, announced at the address Ray's nodes reach this machine at."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from shoal.serve.wire import example_tokens
from tests.ray.cluster import HEAD_IP, LoopbackCluster
from tests.ray.test_service import SERVE_YAML
from tests.service.helpers import running_service, wait_until

pytestmark = pytest.mark.slow


def test_a_router_listens_where_the_service_does_and_is_announced_at_the_driver(
        ray_cluster: LoopbackCluster, tmp_path: Path) -> None:
    one_server = SERVE_YAML.replace("min_replicas: 2", "min_replicas: 1")
    with running_service(tmp_path / "home", address=ray_cluster.address, backend="ray",
                         policy="gavel", host="0.0.0.0",
                         checkpoint_dir=str(tmp_path / "checkpoints")) as service:
        assert service.submit(one_server).status_code == 201
        wait_until(lambda: (service.job("web").get("service") or {}).get("url") is not None,
                   120, "the serve job's router", service.diagnostics)
        url = urlsplit(service.job("web")["service"]["url"])
        assert url.hostname == HEAD_IP, url  # the driver's node address, not 127.0.0.1
        for host in (HEAD_IP, "127.0.0.1"):  # listening on every interface
            answer = httpx.post(f"http://{host}:{url.port}/infer",
                                json={"tokens": example_tokens(1)}, timeout=30.0)
            assert answer.status_code == 200, (host, answer.text)
        service.http.post(f"{service.url}/api/jobs/web/cancel").raise_for_status()
