"""Malformed specs are rejected by the API (422 naming the field) and the CLI; jobs untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from shoal.cli.main import cli
from tests.service.helpers import Service, job_yaml, running_service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    with running_service(tmp_path_factory.mktemp("validation") / "home") as svc:
        yield svc


def test_api_rejects_malformed_specs_naming_the_field(service: Service) -> None:
    # An accepted job that must stay untouched; its command fails fast, no torch needed.
    accepted = (
        'name: keeper\napplication: x\ncommand: ["python", "-c", "import time; time.sleep(30)"]\n'
    )
    assert service.submit(accepted).status_code == 201
    before = [(j["name"], j["submit_time"]) for j in service.jobs()]

    bad_batch = job_yaml("bad-batch").replace("batch_size: 16", "batch_size: -3")
    response = service.submit(bad_batch)
    assert response.status_code == 422
    assert response.json()["detail"]["field"] == "batch_size"

    unknown = job_yaml("bad-field") + "num_gpus: 4\n"
    response = service.submit(unknown)
    assert response.status_code == 422
    assert response.json()["detail"]["field"] == "num_gpus"

    no_command = "name: no-command\napplication: x\n"
    response = service.submit(no_command)
    assert response.status_code == 422
    assert response.json()["detail"]["field"] == "command"

    response = service.submit("name: [unclosed\n")
    assert response.status_code == 422
    assert "YAML" in response.json()["detail"]["message"]

    response = service.http.post(f"{service.url}/api/jobs", json={"name": "j", "batch_size": "x",
                                                                   "application": "a"})
    assert response.status_code == 422
    assert response.json()["detail"]["field"] == "batch_size"

    duplicate = service.submit(accepted)
    assert duplicate.status_code == 409
    assert duplicate.json()["detail"]["field"] == "name"

    after = [(j["name"], j["submit_time"]) for j in service.jobs()]
    assert after == before


def test_absurd_values_and_log_offsets_are_refused_not_stored_or_crashed(
        service: Service) -> None:
    """Values far past any real job (a typo or a unit mistake) get a 422 naming the field,
    never a 201; a bad log offset gets a 422, not a server error."""
    keeper = {"name": "absurd-keeper", "application": "x",
              "command": ["python", "-c", "import time; time.sleep(30)"]}
    assert service.http.post(f"{service.url}/api/jobs", json=keeper).status_code == 201
    before = [j["name"] for j in service.jobs()]
    base = {"name": "absurd", "application": "x", "command": ["python", "-c", "pass"]}
    for field, value in [("batch_size", 10**12), ("max_replicas", 10**9),
                         ("tenant", "t" * 1000)]:
        response = service.http.post(f"{service.url}/api/jobs", json={**base, field: value})
        assert response.status_code == 422, (field, response.text)
        assert response.json()["detail"]["field"] == field
        assert len(response.json()["detail"]["message"]) < 500
    # JSON's Infinity, as Python and JavaScript clients write it.
    infinite = '{"name": "absurd", "application": "x", "weight": Infinity}'
    response = service.http.post(f"{service.url}/api/jobs", content=infinite,
                                 headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"]["field"] == "weight"
    assert [j["name"] for j in service.jobs()] == before

    name = keeper["name"]
    for offset in (-5, 10**20):
        response = service.http.get(f"{service.url}/api/jobs/{name}/logs",
                                    params={"offset": offset})
        assert response.status_code == 422, (offset, response.text)
    assert service.http.get(f"{service.url}/api/jobs/{name}/logs",
                            params={"rank": -1}).status_code == 422
    assert service.http.get(f"{service.url}/api/jobs/{name}/logs",
                            params={"offset": 10**9}).status_code == 200


def test_cli_rejects_malformed_yaml_naming_the_field(service: Service, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(job_yaml("cli-bad").replace("max_replicas: 2", "max_replicas: zero"))
    result = CliRunner().invoke(cli, ["submit", "--home", str(service.home), str(bad)])
    assert result.exit_code != 0
    assert "max_replicas" in result.output
    names = [j["name"] for j in service.jobs()]
    assert "cli-bad" not in names


def test_cancel_stops_a_job(service: Service) -> None:
    result = CliRunner().invoke(cli, ["cancel", "--home", str(service.home), "keeper"])
    assert result.exit_code == 0, result.output
    job = service.job("keeper")
    assert job["state"] == "failed"
    assert job["failure"] == "cancelled by user"
    result = CliRunner().invoke(cli, ["ls", "--home", str(service.home)])
    assert result.exit_code == 0 and "keeper" in result.output
