"""The shoal and sia policies: exact MILP, packable configurations, weights, no starvation."""

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.backends.sim.run import simulate
from shoal.core.types import ClusterState, JobLimits, JobState, JobView, ModelHints
from shoal.perf import GoodputModel, GradStats, PerfParams
from shoal.perf.goodput import optimize_many
from shoal.policy import make_policy
from shoal.policy.configs import (
    Row,
    cluster_configs,
    inexact_types,
    place_configs,
    solve,
    undominated_rows,
)
from shoal.policy.shoal import ShoalPolicy
from shoal.spec import JobSpec, parse_cluster
from shoal.spec.cluster import NodeInfo
from shoal.spec.errors import SpecError

TWO_TYPES = ClusterState((NodeInfo(0, "t4", 4), NodeInfo(1, "t4", 4), NodeInfo(2, "v100", 2)))
THREE_NODES = ClusterState(tuple(NodeInfo(i, "t4", 4) for i in range(3)))


def _brute_force(cost, idle, configs, cluster):
    best = np.inf
    options = [[None, *range(len(configs))] for _ in range(cost.shape[0])]
    for combo in itertools.product(*options):
        value = 0.0
        for j, c in enumerate(combo):
            value += idle[j] if c is None else cost[j, c]
        if not np.isfinite(value):
            continue
        ok = True
        for dtype in cluster.device_types:
            reps = sum(configs[c].replicas for c in combo
                       if c is not None and configs[c].device_type == dtype)
            nodes = sum(configs[c].nodes for c in combo
                        if c is not None and configs[c].device_type == dtype
                        and configs[c].nodes > 1)
            ok &= reps <= cluster.capacity(dtype) and nodes <= len(cluster.nodes_of(dtype))
        if ok:
            best = min(best, value)
    return best


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.data())
def test_milp_equals_brute_force(num_jobs, data):
    configs = cluster_configs(TWO_TYPES)
    cost = np.array([[data.draw(st.floats(-5, 5) | st.just(np.inf)) for _ in configs]
                     for _ in range(num_jobs)])
    idle = np.array([data.draw(st.floats(-2, 5)) for _ in range(num_jobs)])
    solution = solve(cost, idle, configs, TWO_TYPES)
    assert solution.objective == pytest.approx(_brute_force(cost, idle, configs, TWO_TYPES),
                                               abs=1e-6)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=12))
def test_any_count_feasible_choice_packs_onto_nodes(picks):
    cluster = ClusterState(tuple(NodeInfo(i, "t4", 8) for i in range(4)))
    configs = cluster_configs(cluster)
    chosen, used, nodes = {}, 0, 0
    for i, pick in enumerate(picks):
        cfg = configs[pick % len(configs)]
        extra_nodes = cfg.nodes if cfg.nodes > 1 else 0
        if used + cfg.replicas <= 32 and nodes + extra_nodes <= 4:
            chosen[f"j{i}"] = cfg
            used += cfg.replicas
            nodes += extra_nodes
    placed = place_configs(chosen, {}, cluster)
    assert set(placed) == set(chosen)
    load = {}
    for alloc in placed.values():
        for n, c in alloc.per_node().items():
            load[n] = load.get(n, 0) + c
    assert all(v <= 8 for v in load.values())


def _view(name, weight=1.0, profiled=8, progress=0.0, attained=0.0):
    perf = PerfParams(0.05, 0.002, 0.2, 0.01, 0.05, 0.005, 1.5)
    model = GoodputModel(perf, GradStats(1.0, 200.0), 64, 8192, 16, 256)
    return JobView(
        name=name, spec=JobSpec(name=name, application="synthetic", weight=weight),
        state=JobState.PENDING, submit_time=0.0, age=600.0, attained_service=attained,
        num_restarts=0, allocation=None,
        hints=ModelHints({"t4": model}, {"t4": profiled}, progress=progress),
        limits=JobLimits(64, 8192, 16, 256, 64),
    )


def test_tenant_weights_shift_shares():
    # 12 devices for two identical jobs: one gets two whole nodes, the other one node.
    heavy_a = ShoalPolicy(alpha=0.0).decide([_view("a", weight=4.0), _view("b")], THREE_NODES, 0)
    assert (heavy_a["a"].replicas, heavy_a["b"].replicas) == (8, 4)
    heavy_b = ShoalPolicy(alpha=0.0).decide([_view("a"), _view("b", weight=4.0)], THREE_NODES, 0)
    assert (heavy_b["a"].replicas, heavy_b["b"].replicas) == (4, 8)


def test_remaining_work_knob_prefers_the_shorter_job():
    short = _view("short", progress=0.9, attained=3600.0)  # ~400 device-seconds left
    long = _view("long", progress=0.1, attained=3600.0)  # ~9 device-hours left
    for order in ([short, long], [long, short]):
        srpt = ShoalPolicy(weighting="power", alpha=1.0).decide(order, THREE_NODES, 0.0)
        assert (srpt["short"].replicas, srpt["long"].replicas) == (8, 4)


def test_a_job_a_second_into_training_is_not_ranked_behind_every_other_job():
    # 124 device-seconds, 120 of them start-up, at progress 0.0004: its own extrapolation says
    # 310000 device-seconds are left, 4x the longest established job's. The prior (the
    # established jobs' median, 11500) makes it rank between c and d.
    jobs = [_view("a", progress=0.5, attained=2000.0), _view("b", progress=0.3, attained=3000.0),
            _view("c", progress=0.2, attained=4000.0), _view("d", progress=0.1, attained=9000.0),
            _view("fresh", progress=0.0004, attained=124.0)]
    without = ShoalPolicy(prior_progress=0.0).decide(jobs, THREE_NODES, 0.0)
    assert "fresh" not in without and without["d"].replicas > 0
    shrunk = ShoalPolicy().decide(jobs, THREE_NODES, 0.0)
    assert shrunk["fresh"].replicas > 0 and "d" not in shrunk


def test_without_batch_adaptation_no_replica_gets_less_than_its_smallest_micro_batch():
    # Batch 64, smallest micro-batch 16: at most 4 replicas, however many devices are idle.
    decision = ShoalPolicy(adapt_batch=False).decide([_view("a", profiled=32)], THREE_NODES, 0)
    assert 1 <= decision["a"].replicas <= 4
    assert ShoalPolicy().decide([_view("a", profiled=32)], THREE_NODES, 0)["a"].replicas > 4


def test_without_batch_adaptation_goodput_is_that_of_the_users_batch():
    # The user's batch of 4096, not the model's initial 64, is what the job will run at: with
    # a smallest micro-batch of 16 it may use every device, and 32 allows two replicas only.
    large = _view("a", profiled=32)
    large = dataclasses.replace(large, spec=large.spec.model_copy(update={"batch_size": 4096}))
    assert ShoalPolicy(adapt_batch=False).decide([large], THREE_NODES, 0)["a"].replicas > 4
    small = dataclasses.replace(large, spec=large.spec.model_copy(update={"batch_size": 32}))
    assert ShoalPolicy(adapt_batch=False).decide([small], THREE_NODES, 0)["a"].replicas <= 2


def test_a_long_job_among_many_short_ones_finishes(profiles):
    cluster = parse_cluster({
        "name": "tiny", "device_types": [{"name": "t4", "memory_gb": 16}],
        "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 1}],
    })
    jobs = [JobSpec(name="long", application="imagenet", batch_size=200, target_epochs=2)]
    jobs += [JobSpec(name=f"short-{i}", application="cifar10", batch_size=128,
                     target_epochs=2, submit_time=60.0 * i) for i in range(60)]
    result = simulate(jobs, ShoalPolicy(alpha=1.0), cluster, profiles, max_time=10 * 24 * 3600)
    assert not result.timed_out
    by_name = {r.name: r for r in result.records}
    assert by_name["long"].state == JobState.FINISHED
    assert all(r.state == JobState.FINISHED for r in result.records)


def test_fractional_relaxation_falls_back_to_the_exact_milp(monkeypatch):
    """Two jobs that each want 4 of 6 devices: the LP gives each 3/4 of one; the MILP must not."""
    import shoal.policy.configs as configs_module

    paths = []
    integral, fixing = configs_module._integral, configs_module._solve_with_fixing
    monkeypatch.setattr(configs_module, "_integral",
                        lambda *a: paths.append("integral?") or integral(*a))
    monkeypatch.setattr(configs_module, "_solve_with_fixing",
                        lambda *a: paths.append("fixing") or fixing(*a))
    cluster = ClusterState((NodeInfo(0, "t4", 4), NodeInfo(1, "t4", 2)))
    configs = cluster_configs(cluster)
    cost = np.array([[-10.0 if c.replicas == 4 else 0.0 for c in configs]] * 2)
    idle = np.zeros(2)
    solution = solve(cost, idle, configs, cluster)
    assert paths == ["integral?", "fixing"]  # the relaxation was fractional
    assert solution.objective == pytest.approx(_brute_force(cost, idle, configs, cluster))
    assert solution.objective == pytest.approx(-10.0)


def test_reduced_cost_fixing_keeps_the_optimum(monkeypatch):
    # Dense random costs on a small mixed cluster make fractional relaxations common; every
    # instance must still come out at the brute-force optimum, and the fixing path must run.
    import shoal.policy.configs as configs_module

    fixings = []
    fixing = configs_module._solve_with_fixing
    monkeypatch.setattr(configs_module, "_solve_with_fixing",
                        lambda *a: fixings.append(1) or fixing(*a))
    rng = np.random.default_rng(0)
    configs = cluster_configs(TWO_TYPES)
    for _ in range(80):
        jobs = int(rng.integers(2, 5))
        cost = rng.uniform(-6, 1, (jobs, len(configs)))
        idle = rng.uniform(-1, 1, jobs)
        solution = configs_module.solve(cost, idle, configs, TWO_TYPES)
        assert solution.objective == pytest.approx(
            _brute_force(cost, idle, configs, TWO_TYPES), abs=1e-6)
    assert len(fixings) >= 20  # 40 of these 80 relaxations are fractional (scipy 1.17)


def _undominated_one_row(row: Row, type_index: np.ndarray) -> Row:
    """Reference: per type, keep a configuration only if it beats every earlier one."""
    keep = []
    best: dict[int, float] = {}
    for c, cost in zip(row.index, row.cost, strict=True):
        t = int(type_index[c])
        if t not in best or cost < best[t]:
            keep.append(True)
            best[t] = cost
        else:
            keep.append(False)
    mask = np.array(keep, dtype=bool)
    return Row(row.index[mask], row.cost[mask])


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.floats(-3, 3) | st.just(1.0), min_size=0, max_size=9),
                min_size=1, max_size=6))
def test_batched_dominance_pruning_matches_per_row(costs):
    configs = cluster_configs(TWO_TYPES)
    type_index = np.array([TWO_TYPES.device_types.index(c.device_type) for c in configs])
    rows = [Row(np.arange(len(c)) % len(configs), np.array(c, dtype=float)) for c in costs]
    rows = [Row(np.unique(r.index), r.cost[: len(np.unique(r.index))]) for r in rows]
    for single, batched in zip([_undominated_one_row(r, type_index) for r in rows],
                               undominated_rows(rows, type_index), strict=True):
        assert np.array_equal(single.index, batched.index)
        assert np.array_equal(single.cost, batched.cost)


def test_batched_goodput_equals_per_model_optimize():
    rng = np.random.default_rng(3)
    models = [GoodputModel(PerfParams(*rng.uniform(0.01, 0.2, 6), rng.uniform(1, 3)),
                           GradStats(sqr=rng.uniform(0.1, 1), var=rng.uniform(0.1, 5)),
                           init_batch_size=int(b), max_batch_size=int(b) * 16,
                           min_atomic_bsz=8, max_atomic_bsz=int(b))
              for b in rng.choice([32, 64, 128], size=5)]
    model_of = rng.integers(0, 5, size=200)
    nodes = rng.integers(1, 4, size=200)
    replicas = nodes * rng.integers(1, 9, size=200)
    batched = optimize_many(models, model_of, nodes, replicas)
    single = [models[m].optimize(int(n), int(r)).goodput
              for m, n, r in zip(model_of, nodes, replicas, strict=True)]
    assert batched == pytest.approx(np.array(single), rel=1e-12)


@pytest.mark.parametrize("sigma,p", [(0.5, -1.0), (0.3, -0.5), (0.7, 0.5)])
def test_rank_weights_make_the_objective_optimum_the_hesrpt_shares(sigma, p):
    # Continuous relaxation with speedup n^sigma: minimise sum_k w_k (n_k^sigma)^p (maximise
    # for p > 0) over shares n summing to 1. Its optimum must be heSRPT's allocation.
    from scipy.optimize import minimize

    policy = ShoalPolicy(weighting="rank", sigma=sigma, p=p)
    jobs = [_view(f"j{i}", progress=0.5, attained=600.0 * (i + 1)) for i in range(5)]
    weights = policy._rank_weights(jobs, policy._remaining_work(jobs))
    ordered = sorted(jobs, key=lambda j: j.attained_service, reverse=True)  # largest first
    m, c = len(jobs), 1 / (1 - sigma)
    hesrpt = np.array([(k / m) ** c - ((k - 1) / m) ** c for k in range(1, m + 1)])
    w = np.array([weights[j.name] for j in ordered])
    sign = 1.0 if p < 0 else -1.0

    def objective(z):
        n = np.exp(z) / np.exp(z).sum()
        return sign * float(np.sum(w * n ** (sigma * p)))

    found = minimize(objective, np.zeros(m), method="BFGS", options={"gtol": 1e-12})
    shares = np.exp(found.x) / np.exp(found.x).sum()
    assert shares == pytest.approx(hesrpt, rel=1e-3)
    assert np.all(np.diff(shares) > 0)  # less remaining work, larger share


def test_rank_weighting_gives_the_job_closest_to_done_more_devices():
    short = _view("short", progress=0.9, attained=3600.0)
    long = _view("long", progress=0.1, attained=3600.0)
    for order in ([short, long], [long, short]):
        decision = ShoalPolicy(weighting="rank").decide(order, THREE_NODES, 0.0)
        assert decision["short"].replicas > decision["long"].replicas


def test_a_move_that_can_never_pay_for_its_restart_is_not_chosen():
    # Restarted more often than its age covers: any move has restart factor 0 (infinite cost
    # at p < 0). Without move_over_stop the solver skips those moves: the job stays where it is
    # or, when another job gains more from its device, waits (a preemption, not a move).
    from dataclasses import replace

    from shoal.core.types import Allocation

    stuck = replace(_view("stuck", progress=0.5, attained=600.0), num_restarts=40,
                    allocation=Allocation("t4", (0,)), state=JobState.RUNNING)
    for policy in (ShoalPolicy(weighting="power", move_over_stop=False),
                   ShoalPolicy(weighting="rank", move_over_stop=False),
                   ShoalPolicy(charge_preemption=True, move_over_stop=False)):
        decision = policy.decide([stuck, _view("new")], THREE_NODES, 0.0)
        assert decision["new"].replicas > 1
        if "stuck" in decision:
            assert (decision["stuck"].device_type, decision["stuck"].nodes) == ("t4", (0,))
    assert "stuck" in ShoalPolicy(weighting="power", move_over_stop=False).decide(
        [stuck, _view("new")], THREE_NODES, 0.0)
    # With it (the default) such a move is valued just above stopping the job, never above
    # staying: alone, the job keeps its device rather than grow.
    for policy in (ShoalPolicy(), ShoalPolicy(charge_preemption=True)):
        assert policy.decide([stuck, _view("new")], THREE_NODES, 0.0)["new"].replicas > 1
        assert policy.decide([stuck], THREE_NODES, 0.0)["stuck"].nodes == (0,)


def test_a_job_that_must_give_up_its_devices_moves_to_free_ones_instead_of_stopping():
    # One t4 device and one v100 device. A young job (restart factor 10 / 130) holds the t4;
    # a new job that may run only on t4, and ranks first, needs it. Stopping the young job costs
    # it the same restart when it resumes as moving it to the idle v100 now.
    from dataclasses import replace

    from shoal.core.types import Allocation

    mixed = ClusterState((NodeInfo(0, "t4", 1), NodeInfo(1, "v100", 1)))
    base = _view("young", progress=0.5, attained=600.0)
    model = base.hints.goodput["t4"]
    young = replace(base, age=10.0, state=JobState.RUNNING, allocation=Allocation("t4", (0,)),
                    hints=ModelHints({"t4": model, "v100": model}, {"t4": 8, "v100": 8},
                                     progress=0.5))
    plain = _view("new")
    new = replace(plain, spec=plain.spec.model_copy(update={"device_types": ["t4"]}))
    moved = ShoalPolicy().decide([young, new], mixed, 0.0)
    assert (moved["new"].device_type, moved["new"].nodes) == ("t4", (0,))
    assert (moved["young"].device_type, moved["young"].nodes) == ("v100", (1,))
    stopped = ShoalPolicy(move_over_stop=False).decide([young, new], mixed, 0.0)
    assert set(stopped) == {"new"}
    # Alone, it stays: the floor only ranks a move above stopping, never above staying.
    assert ShoalPolicy().decide([young], mixed, 0.0)["young"].device_type == "t4"


def test_a_waiting_job_gets_devices_by_the_no_starvation_bound():
    # docs/theory.md, no starvation: a waiting job j displaces a running job k once
    # w_j r_j (1 + Q_j/H) > w_k r_k. One device, held by the job closer to done: under rank
    # weights (M = 2) r_k / r_j = (3/4 / 1/4)^(1 - p sigma), so j waits about 2.9 hours.
    from dataclasses import replace

    from shoal.core.types import Allocation
    from shoal.policy.shoal import DEVICE_HOUR
    from shoal.spec.cluster import NodeInfo

    one = ClusterState((NodeInfo(0, "t4", 1),))
    holder = replace(_view("holder", progress=0.9, attained=3600.0),
                     allocation=Allocation("t4", (0,)), state=JobState.RUNNING)
    waiting = _view("waiting", progress=0.1, attained=3600.0)
    policy = ShoalPolicy()
    k = policy.knobs
    ratio = 3.0 ** (1 - k.p * k.sigma)
    threshold = (ratio - 1) * DEVICE_HOUR
    assert set(policy.decide([holder, waiting], one, 0.0)) == {"holder"}
    assert set(policy.decide([holder, waiting], one, 0.98 * threshold)) == {"holder"}
    assert set(policy.decide([holder, waiting], one, 1.02 * threshold)) == {"waiting"}


def test_charging_preemptions_keeps_a_running_job_longer_but_not_for_ever():
    # As in the no-starvation test, with the holder's preemption charged its restart factor
    # f = 600 / (600 + 120): the waiting job needs weight 0.1 W_w > (1.1 f^p - 1) W_h, about
    # 2.05 W_h, instead of W_w > W_h; it still gets the device as its wait grows.
    from dataclasses import replace

    from shoal.core.types import Allocation
    from shoal.policy.shoal import DEVICE_HOUR
    from shoal.spec.cluster import NodeInfo

    one = ClusterState((NodeInfo(0, "t4", 1),))
    holder = replace(_view("holder", progress=0.9, attained=3600.0),
                     allocation=Allocation("t4", (0,)), state=JobState.RUNNING)
    waiting = _view("waiting", progress=0.1, attained=3600.0)
    plain, charged = ShoalPolicy(), ShoalPolicy(charge_preemption=True)
    k = plain.knobs
    threshold = (3.0 ** (1 - k.p * k.sigma) - 1) * DEVICE_HOUR
    for policy in (plain, charged):
        assert set(policy.decide([holder, waiting], one, 0.0)) == {"holder"}
    assert set(plain.decide([holder, waiting], one, 1.02 * threshold)) == {"waiting"}
    assert set(charged.decide([holder, waiting], one, 1.02 * threshold)) == {"holder"}
    assert set(charged.decide([holder, waiting], one, 3.0 * threshold)) == {"waiting"}
    # Without restart awareness nothing is charged.
    blind = ShoalPolicy(charge_preemption=True, restart_aware=False)
    blind.decide([holder, waiting], one, 0.0)
    assert set(blind.decide([holder, waiting], one, 1.02 * threshold)) == {"waiting"}


def test_inexact_node_sizes_are_named_once(caplog):
    uneven = ClusterState((NodeInfo(0, "t4", 6), NodeInfo(1, "t4", 6), NodeInfo(2, "v100", 2),
                           NodeInfo(3, "v100", 4)))
    assert inexact_types(TWO_TYPES) == []
    assert inexact_types(uneven) == ["t4", "v100"]
    jobs = [_view(f"j{i}") for i in range(3)]
    import shoal.policy.configs as configs_module

    configs_module._warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="shoal.policy.configs"):
        ShoalPolicy().decide(jobs, TWO_TYPES, 0.0)
        assert not caplog.records
        ShoalPolicy().decide(jobs, uneven, 0.0)
        ShoalPolicy().decide(jobs, uneven, 60.0)
    assert len(caplog.records) == 1
    assert "t4, v100" in caplog.text and "power of two" in caplog.text


def test_a_job_takes_a_whole_node_at_once_and_grows_across_nodes_as_it_measures():
    # Alone on three 4-device nodes, having measured one replica: a whole node at once;
    # across nodes only up to growth x what it measured.
    alone = ShoalPolicy().decide([_view("a", profiled=1)], THREE_NODES, 0.0)
    assert alone["a"].replicas == 4 and len(set(alone["a"].nodes)) == 1
    capped = ShoalPolicy(whole_node=False, first_growth=0.0).decide(
        [_view("a", profiled=1)], THREE_NODES, 0.0)
    assert capped["a"].replicas == 4  # growth 4 x 1 replica
    two = ShoalPolicy(growth=2.0).decide([_view("a", profiled=1)], THREE_NODES, 0.0)
    assert two["a"].replicas == 4  # a whole node, though growth alone would allow 2
    assert ShoalPolicy(growth=2.0, whole_node=False).decide(
        [_view("a", profiled=1)], THREE_NODES, 0.0)["a"].replicas == 2
    measured = ShoalPolicy(growth=2.0).decide([_view("a", profiled=4)], THREE_NODES, 0.0)
    assert measured["a"].replicas == 8  # two whole nodes: 2 x the 4 it measured


def test_a_rigid_job_runs_at_its_size_across_nodes_before_measuring_anything():
    view = _view("rigid", profiled=0)
    view = dataclasses.replace(view, spec=view.spec.model_copy(
        update={"num_replicas": 8, "rigid": True}))
    for policy in (ShoalPolicy(), make_policy("sia")):
        grant = policy.decide([view], THREE_NODES, 0.0)["rigid"]
        assert grant.replicas == 8 and len(set(grant.nodes)) == 2


def test_a_move_is_charged_the_jobs_own_measured_restart_cost():
    # Charge = restart_charge (4) x the job's measured restart seconds, restart_delay (120 s)
    # while it has measured none. Age 600 s, one restart so far: a 5 s restart (charge 20 s)
    # keeps a move's restart factor near 1; a 200 s one (charge 800 s) makes every move
    # cost more than the job's whole life, so it keeps its one device.
    from dataclasses import replace

    from shoal.core.types import Allocation

    running = replace(_view("a", profiled=1), num_restarts=1, state=JobState.RUNNING,
                      allocation=Allocation("t4", (0,)))
    cheap, costly = (replace(running, restart_seconds=s) for s in (5.0, 200.0))
    policy = ShoalPolicy()
    assert [policy.move_charge(job) for job in (running, cheap, costly)] == [120.0, 20.0, 800.0]
    assert policy.decide([cheap], THREE_NODES, 0.0)["a"].replicas > 1
    assert policy.decide([running], THREE_NODES, 0.0)["a"].replicas > 1
    stays = policy.decide([costly], THREE_NODES, 0.0)["a"]
    assert (stays.replicas, stays.device_type, stays.nodes) == (1, "t4", (0,))
    free = ShoalPolicy(restart_charge=0.0).decide([costly], THREE_NODES, 0.0)["a"]
    assert free.replicas > 1


def test_a_job_near_its_end_is_not_moved_for_a_gain_its_restart_would_eat():
    # One node of 4 devices for 600 s (2400 device-seconds), a 30 s restart (charge 120 s),
    # alone on three nodes. At 99% done about 6 s remain on 4 devices, less on 12: a move
    # cannot pay for its restart there. At 10% done 1.5 hours remain, and the job grows.
    from dataclasses import replace

    from shoal.core.types import Allocation

    def running(progress):
        return replace(_view("a", profiled=4, progress=progress, attained=2400.0),
                       state=JobState.RUNNING, allocation=Allocation("t4", (0, 0, 0, 0)),
                       restart_seconds=30.0)

    policy = ShoalPolicy()
    assert policy.decide([running(0.99)], THREE_NODES, 0.0)["a"].replicas == 4
    assert policy.decide([running(0.10)], THREE_NODES, 0.0)["a"].replicas > 4
    # Without the remaining-time term the age-based factor alone lets the nearly done job move.
    blind = ShoalPolicy(restart_horizon=False)
    assert blind.decide([running(0.99)], THREE_NODES, 0.0)["a"].replicas > 4


def test_a_job_that_has_run_on_one_node_only_grows_across_nodes_by_first_growth():
    # Alone on three 4-device nodes, having measured a whole node: growth 4 allows all three
    # nodes; first_growth 2 allows two until the job has run across nodes.
    assert ShoalPolicy(first_growth=0.0).decide(
        [_view("a", profiled=4)], THREE_NODES, 0.0)["a"].replicas == 12
    # The ablation keeps whatever growth is set: first_growth is off, not 4.
    assert make_policy("shoal-no-first-growth").tuned(growth=8.0).decide(
        [_view("a", profiled=1)], THREE_NODES, 0.0)["a"].replicas == 8
    cautious = ShoalPolicy(first_growth=2.0)
    assert cautious.decide([_view("a", profiled=4)], THREE_NODES, 0.0)["a"].replicas == 8
    assert cautious.decide([_view("a", profiled=8)], THREE_NODES, 0.0)["a"].replicas == 12
    # It only ever lowers growth: with growth 2 the first step is 2 as well.
    assert ShoalPolicy(growth=2.0, first_growth=3.0).decide(
        [_view("a", profiled=4)], THREE_NODES, 0.0)["a"].replicas == 8
    with pytest.raises(SpecError, match="first_growth"):
        ShoalPolicy(first_growth=0.5)
