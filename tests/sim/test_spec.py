import pytest

from shoal.spec import (
    SpecError,
    load_cluster,
    load_job_yaml,
    load_workload_csv,
    parse_cluster,
    preset_names,
)


def test_presets_load_and_expand():
    assert {"pollux-t4-64", "hetero-64", "hetero-256"} <= set(preset_names())
    t4 = load_cluster("pollux-t4-64")
    assert t4.total_devices == 64 and len(t4.expand()) == 16
    het = load_cluster("hetero-64")
    assert het.total_devices == 64
    assert len({n.device_type for n in het.expand()}) == 3
    assert load_cluster("hetero-256").total_devices == 256


def test_job_yaml_errors_name_the_field():
    with pytest.raises(SpecError) as err:
        load_job_yaml("name: a\napplication: cifar10\nbatch_size: -4\n")
    assert err.value.field == "batch_size"
    assert "greater than or equal to 1" in str(err.value)
    with pytest.raises(SpecError) as err:
        load_job_yaml("name: a\napplication: cifar10\nbatchsize: 4\n")
    assert err.value.field == "batchsize"
    with pytest.raises(SpecError, match="min_replicas"):
        load_job_yaml("name: a\napplication: x\nmin_replicas: 5\nmax_replicas: 2\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job_yaml("name: [unclosed")


def test_cluster_with_unknown_device_type_is_rejected():
    with pytest.raises(SpecError, match="device type 'h100'"):
        parse_cluster({"device_types": [{"name": "t4", "memory_gb": 16}],
                       "nodes": [{"device_type": "h100", "devices_per_node": 8, "count": 1}]})
    with pytest.raises(SpecError, match="neither a cluster YAML file nor a preset"):
        load_cluster("no-such-preset")


def test_workload_csv(pollux_data, tmp_path):
    jobs = load_workload_csv(pollux_data / "workloads" / "workload-1.csv")
    assert len(jobs) == 160
    assert jobs[0].name == "cifar10-0" and jobs[0].submit_time == 107
    bad = tmp_path / "bad.csv"
    bad.write_text("name,time,application\nx,0,cifar10\n")
    with pytest.raises(SpecError, match="missing column"):
        load_workload_csv(bad)
