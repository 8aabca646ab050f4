import pytest

from shoal.core.placement import PlacementError, place
from shoal.core.types import Allocation, ClusterState, Grant
from shoal.spec.cluster import NodeInfo

CLUSTER = ClusterState((*tuple(NodeInfo(i, "t4", 4) for i in range(3)), NodeInfo(3, "v100", 8)))


def test_packs_onto_the_emptiest_nodes_in_decision_order():
    placed = place({"a": Grant(3), "b": Grant(4), "c": Grant(2)}, CLUSTER, {})
    assert placed["a"] == Allocation("t4", (0, 0, 0))
    assert placed["b"] == Allocation("t4", (1, 1, 1, 1))
    assert placed["c"] == Allocation("t4", (2, 2))


def test_running_jobs_stay_where_they_are():
    current = {"a": Allocation("t4", (2, 2))}
    placed = place({"b": Grant(4), "a": Grant(2)}, CLUSTER, current)
    assert placed["a"] == current["a"]
    assert 2 not in placed["b"].nodes


def test_device_type_and_pinned_nodes_are_honoured():
    placed = place({"g": Grant(6, device_type="v100"), "p": Grant(2, nodes=(1, 2))}, CLUSTER, {})
    assert placed["g"] == Allocation("v100", (3,) * 6)
    assert placed["p"] == Allocation("t4", (1, 2))
    with pytest.raises(PlacementError, match="over-committed"):
        place({"x": Grant(5, nodes=(0,) * 5)}, CLUSTER, {})


def test_a_grant_that_does_not_fit_is_left_unplaced():
    placed = place({"a": Grant(12), "b": Grant(9)}, CLUSTER, {})
    assert placed["a"].num_replicas == 12
    assert "b" not in placed


def test_a_grant_without_type_falls_back_to_a_type_where_it_fits():
    placed = place({"a": Grant(12), "b": Grant(3)}, CLUSTER, {})
    assert placed["a"] == Allocation("t4", (0,) * 4 + (1,) * 4 + (2,) * 4)
    assert placed["b"] == Allocation("v100", (3, 3, 3))
