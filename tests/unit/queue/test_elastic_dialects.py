"""Elastic pods under the dialect rules: they are the first victims of reclaim across the quota tree, each
pod judged by the same rules as a whole gang (guarantee floors, KAI's reclaim below quota, opt-outs,
who may preempt), and a reservation's credit counts only the elastic pods it named."""

from __future__ import annotations

from shared.kernel.events import BackedOff, Dequeued, ReclaimRequested
from shared.kernel.model import WorkloadSpec
from tests.builders import gang, pod_set, queue_spec, workload
from tests.builders.queue import QueueDriver, capacity, cpu_gang, defined, job, placed, running, submitted

GPU = "nvidia.com/gpu"


def _elastic(key: str, queue: str, gpus: int, elastic: int, at: float, **kw) -> WorkloadSpec:
    """A 1-CPU head and ``gpus`` 1-GPU workers, and ``elastic`` more workers the owner wants."""
    worker = pod_set("worker", gpus, cpu="1", **{GPU: "1"}).model_copy(update={"elastic": elastic})
    return workload(key, queue=queue, submitted_at=at, gang_=gang(pod_set("head", 1, cpu="1"), worker), **kw)


def _admit(d: QueueDriver, spec: WorkloadSpec, at: float) -> None:
    d.step(submitted(spec), at)
    d.step(placed(spec.key, spec.queue), at)     # placement holds the gang: its elastic pods are granted
    d.step(running(spec.key), at)


def _gpu_job(key: str, queue: str, gpus: int, at: float, **kw) -> WorkloadSpec:
    return job(key, queue, at=at, gang_=cpu_gang("1", **{GPU: str(gpus)}), **kw)


def _decisions(out: list) -> list[tuple]:
    return [(x.type, x.key, getattr(x, "victims", ()),
             tuple((v.key, v.pod_set, v.count) for v in getattr(x, "elastic_victims", ())))
            for x in out if isinstance(x, (Dequeued, ReclaimRequested, BackedOff))]


def _tree(dialect: str, *, root: str, a_min: str, b_min: str) -> QueueDriver:
    """root (max ``root`` GPUs, nodes are never short) over leaves a and b."""
    d = QueueDriver()
    d.step(capacity(cpu="64", memory="256Gi", **{GPU: "32"}), 0.0)
    d.step(defined(queue_spec("root", dialect=dialect, guarantee={GPU: root}, limit={GPU: root})))
    d.step(defined(queue_spec("a", parent="root", dialect=dialect, guarantee={GPU: a_min}, limit={GPU: root})))
    d.step(defined(queue_spec("b", parent="root", dialect=dialect, guarantee={GPU: b_min}, limit={GPU: root})))
    return d


def test_reclaim_across_the_tree_takes_a_borrowers_elastic_pods_before_its_gang():
    d = _tree("elasticquotatree", root="8", a_min="4", b_min="4")
    _admit(d, _elastic("ns/a", "a", 2, 6, 1.0), 1.0)             # 2 + 6 elastic: the root's max
    assert d.core.status()["root"]["usage"][GPU] == 8000
    out = d.step(submitted(_gpu_job("ns/b1", "b", 2, 10.0)), 10.0)
    assert _decisions(out) == [("ReclaimRequested", "ns/b1", (), (("ns/a", "worker", 2),))]
    reclaim = next(x for x in out if isinstance(x, ReclaimRequested))
    assert reclaim.reason.endswith("reclaiming 2 elastic pod(s) of ns/a (worker) from queues over their fair share "
                                   "to stay within queue root max nvidia.com/gpu 8: used 8, requested 2")


def test_elastic_pods_that_do_not_cover_leave_the_gang_to_each_dialects_floor():
    """a holds 7 of its own and 1 elastic above its guarantee 6; b, guaranteed 2 only once a holds the
    root's 8 (before, Volcano would have kept a out of b's guarantee), needs them. The one elastic pod is
    not enough: Volcano keeps a's guarantee and says why, KAI takes the whole job."""
    for dialect, expected in (("volcano", "BackedOff"), ("kai", "ReclaimRequested")):
        d = _tree(dialect, root="8", a_min="6", b_min="0")
        _admit(d, _elastic("ns/a", "a", 7, 1, 1.0), 1.0)
        d.step(defined(queue_spec("b", parent="root", dialect=dialect, guarantee={GPU: "2"}, limit={GPU: "8"})))
        out = _decisions(d.step(submitted(_gpu_job("ns/b1", "b", 2, 10.0)), 10.0))
        assert [x[0] for x in out] == [expected], dialect
        if dialect == "kai":
            assert out[0][2:] == (("ns/a",), ())
        else:
            reason = d.core._workloads["ns/b1"].last_reason
            assert reason.endswith("Reclaim refused: queue a would fall below its guarantee nvidia.com/gpu 6 "
                                   "(used 8, ns/a holds 8).")


def test_elastic_pods_of_a_pinned_workload_are_never_victims_and_the_refusal_says_why():
    d = QueueDriver()
    d.step(capacity(cpu="8", memory="64Gi", **{GPU: "8"}), 0.0)
    d.step(defined(queue_spec("a")))
    d.step(defined(queue_spec("b")))
    _admit(d, _elastic("ns/big", "a", 2, 6, 1.0, preemptible=False), 1.0)   # volcano.sh/preemptable: "false"
    out = d.step(submitted(_gpu_job("ns/b1", "b", 2, 10.0)), 10.0)
    assert _decisions(out) == [("Dequeued", "ns/b1", (), ())]     # no victim: placement judges the nodes
    assert d.core._workloads["ns/b1"].reclaim_note == (
        "Reclaim refused: queue a is above its share but its work is not preemptible.")


def test_a_workload_pinned_in_one_pod_set_gives_the_elastic_pods_of_the_others_to_reclaim():
    """Volcano reads ``volcano.sh/preemptable`` per pod: a pinned head keeps the gang, not the workers."""
    for pinned, decision in ((("head",), ("ReclaimRequested", "ns/b1", (), (("ns/big", "worker", 1),))),
                             (("worker",), ("Dequeued", "ns/b1", (), ()))):
        d = QueueDriver()
        d.step(capacity(cpu="8", memory="64Gi", **{GPU: "8"}), 0.0)
        d.step(defined(queue_spec("a")))
        d.step(defined(queue_spec("b")))
        _admit(d, _elastic("ns/big", "a", 2, 6, 1.0, preemptible=False, pinned_pod_sets=pinned), 1.0)
        out = d.step(submitted(_gpu_job("ns/b1", "b", 2, 10.0)), 10.0)
        assert _decisions(out) == [decision], pinned


def test_a_suspended_workload_of_a_queue_that_only_overtakes_takes_no_elastic_pod_of_its_queue():
    d = QueueDriver()
    d.step(capacity(cpu="32", memory="64Gi", **{GPU: "16"}), 0.0)
    d.step(defined(queue_spec("q", dialect="elasticquotatree", limit={GPU: "6"})))
    _admit(d, _elastic("ns/low", "q", 2, 4, 1.0, priority=1), 1.0)
    high = _gpu_job("ns/high", "q", 2, 10.0, priority=50).model_copy(update={"gate": "suspend", "preempts": False})
    assert [x[0] for x in _decisions(d.step(submitted(high), 10.0))] == ["BackedOff"]
    pods = _gpu_job("ns/pods", "q", 2, 10.0, priority=50)         # pod-gated: the scheduler preempts
    mine = [x for x in _decisions(d.step(submitted(pods), 11.0)) if x[1] == "ns/pods"]
    assert mine == [("ReclaimRequested", "ns/pods", (), (("ns/low", "worker", 2),))]


def test_two_reclaims_in_one_instant_count_only_the_elastic_pods_the_first_named():
    """b1 needs 2 at the root (max 9, a holds 8) and names 2 elastic pods of a2; the root then counts
    max(b1, those pods) = 3 more, not b1's 3 less a2's whole 4: b2 still needs one pod, of a1."""
    d = _tree("elasticquotatree", root="9", a_min="4", b_min="4")
    _admit(d, _elastic("ns/a1", "a", 1, 3, 1.0), 1.0)
    _admit(d, _elastic("ns/a2", "a", 1, 3, 2.0), 2.0)
    assert d.core.status()["a"]["usage"][GPU] == 8000
    d.send(submitted(_gpu_job("ns/b1", "b", 3, 10.0)), 10.0)
    d.send(submitted(_gpu_job("ns/b2", "b", 1, 10.0)))
    assert _decisions(d.settle()) == [("ReclaimRequested", "ns/b1", (), (("ns/a2", "worker", 2),)),
                                      ("ReclaimRequested", "ns/b2", (), (("ns/a1", "worker", 1),))]
