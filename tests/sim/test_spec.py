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


def test_misspelled_fields_get_the_closest_accepted_name():
    with pytest.raises(SpecError, match="did you mean 'target_epochs'") as err:
        load_job_yaml("name: a\napplication: cifar10\ntarget_epoch: 3\n")
    assert err.value.field == "target_epoch"
    # Nested models are followed: a node group's own fields are suggested, not the cluster's.
    with pytest.raises(SpecError, match="did you mean 'devices_per_node'"):
        parse_cluster({"device_types": [{"name": "t4", "memory_gb": 16}],
                       "nodes": [{"device_type": "t4", "device_per_node": 4, "count": 1}]})
    # Nothing close: the accepted names are listed instead of a guess.
    with pytest.raises(SpecError, match="accepted fields here: name, kind") as err:
        load_job_yaml("name: a\napplication: cifar10\nzzz: 1\n")
    assert "did you mean" not in str(err.value)


def test_a_command_given_as_one_string_shows_the_list_to_write():
    with pytest.raises(SpecError, match=r'write it as a list, e\.g\. \["python", "train\.py"\]'):
        load_job_yaml("name: a\napplication: x\ncommand: python train.py\n")


def test_mistyped_preset_policy_and_knob_names_are_suggested():
    from shoal.policy.registry import select_policies

    with pytest.raises(SpecError, match="did you mean 'hetero-64'"):
        load_cluster("hetero64")
    with pytest.raises(SpecError, match="did you mean 'pollux'"):
        select_policies("shoal,polux")
    with pytest.raises(SpecError, match="did you mean 'restart_charge'"):
        select_policies("shoal", ["restart_charg=2"])
    with pytest.raises(SpecError) as err:
        load_cluster("no-such-preset")
    assert "did you mean" not in str(err.value)


def test_closest_ignores_case_and_separators_and_refuses_far_names():
    from shoal.spec.suggest import closest

    assert closest("Target-Epochs", ["batch_size", "target_epochs"]) == "target_epochs"
    assert closest("max_replica", ["min_replicas", "max_replicas"]) == "max_replicas"
    assert closest("gpu", ["batch_size", "target_epochs"]) is None
    assert closest("anything", []) is None
