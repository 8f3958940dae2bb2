"""Hostile input found by the security review (issue 33): each ends in one line or a Rejected event
with a short reason, never a traceback, a loop or memory copied into every reason."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services.reconciler.ingest import kept, observe
from shared.kernel.kube import REFUSED
from shared.kernel.validation import QUOTED_CHARS, TEXT_CHARS
from shared.runtime.simulate import simulate
from shared.sim.scenario import ScenarioError, parse_scenario
from tests.builders import pod, ray_cluster, ray_job


def _scenario(*steps: list[dict[str, Any]], gpu: bool = False) -> str:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", **({"nvidia.com/gpu": "2"} if gpu else {})}
    return yaml.safe_dump({
        "name": "hostile", "cluster": {"nodes": [{"name": "n1", "capacity": capacity}]}, "until": "30s",
        "steps": [{"at": f"{i}s", "apply": yaml.safe_dump_all(docs, width=10**9)} for i, docs in enumerate(steps)]},
        width=10**9)


def _volcano_queue(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"},
            "spec": {"weight": 1, **spec}}


def _refusal(text: str) -> str:
    with pytest.raises(ScenarioError) as caught:
        simulate(parse_scenario(text))
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_mapping_with_a_key_that_is_no_text_is_refused_in_one_line():
    assert "a key is int, not a string" in _refusal(_scenario([{**_volcano_queue(), 1: 2}]))
    assert "a key is null, not a string" in _refusal(_scenario([_volcano_queue(capability={None: "1"})]))


def test_a_hexadecimal_integer_beyond_the_int_string_limit_is_refused_in_one_line():
    text = _scenario([_volcano_queue(capability={"cpu": 1})]).replace("cpu: 1", "cpu: 0x" + "f" * 4400)
    assert "an integer of more than 4,300 digits" in _refusal(text)


def test_a_pod_whose_node_name_is_a_list_is_refused_as_the_api_server_would():
    bad = pod("p", requests={"cpu": "1"})
    bad["spec"]["nodeName"] = ["n1"]
    bad["spec"]["containers"][0]["image"] = "x"
    assert _refusal(_scenario([bad])).endswith(
        "spec.nodeName: Invalid value: 'list': spec.nodeName in body must be of type string")


def test_a_forged_pod_whose_node_name_is_a_list_is_refused_at_ingest():
    bad = pod("p", requests={"cpu": "1"})
    bad["spec"]["nodeName"] = ["n1"]
    change = observe("Added", bad)
    assert change.object["metadata"]["annotations"][REFUSED] == (
        "spec.nodeName: Invalid value: 'list': spec.nodeName in body must be of type string")


def test_a_rayjob_applied_again_without_its_namespace_is_the_same_rayjob():
    job = ray_job("j1")
    again = ray_job("j1")
    del again["metadata"]["namespace"]
    again["spec"]["suspend"] = True
    run = simulate(parse_scenario(_scenario([job], [again])))
    assert "default/j1" in run.result()["workloads"]


def _log(run: Any) -> list[Any]:
    return list(run.runtime.log)


def test_a_kai_number_beyond_a_float_is_rejected_saying_so():
    queue = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"},
             "spec": {"resources": {"cpu": {"quota": 10**400, "limit": -1, "overQuotaWeight": 1}}}}
    run = simulate(parse_scenario(_scenario([queue])))
    [rejected] = [e.payload for e in _log(run) if e.type == "QueueRejected"]
    assert rejected.reason == "spec.resources.cpu.quota: a 1329-bit number is too large for a number (at most about 1.8e308)"


def test_a_huge_submission_mode_is_rejected_once_with_a_short_reason():
    job = ray_job("j1")
    job["spec"]["submissionMode"] = "x" * 300_000
    run = simulate(parse_scenario(_scenario([job])))
    log = _log(run)
    assert len(log) < 100  # was: a reject-then-annotate loop at one instant, 4 GB within 30 s
    reasons = [e.payload.reason for e in log if e.type == "WorkloadRejected"]
    assert reasons and all(len(r) < QUOTED_CHARS + 120 for r in reasons)
    assert reasons[0].startswith("spec.submissionMode: 'xxx") and "...' is not one of" in reasons[0]
    assert run.runtime.cycles_stopped == []


def test_a_huge_gpu_fraction_is_rejected_with_a_short_reason():
    """Was: the rejection quoted all 275 KB into the status annotation, the object grew past ingest's bound,
    was refused (a short reason), shrank, was read again: a loop at one instant, 4 GB within 30 s."""
    cluster = ray_cluster("c1")
    cluster["spec"]["headGroupSpec"]["template"]["metadata"] = {"annotations": {"gpu-fraction": "x" * 275_000}}
    run = simulate(parse_scenario(_scenario([cluster], gpu=True)))
    log = _log(run)
    assert len(log) < 100
    [reason] = [e.payload.reason for e in log if e.type == "WorkloadRejected"]
    assert reason.startswith("spec.headGroupSpec.template.metadata.annotations.gpu-fraction: 'xxx")
    assert len(reason) < QUOTED_CHARS + 100 and "...' is not a number" in reason
    assert run.runtime.cycles_stopped == []


def test_what_muster_writes_into_a_queue_status_does_not_come_back_as_input():
    queue = {**_volcano_queue(), "status": {"state": "Closed", "pending": 3, "allocated": {"cpu": "1" * 300_000}}}
    assert kept(queue)["status"] == {"state": "Closed"}


def test_effect_text_is_bounded_where_effects_are_made():
    from shared.kernel.events import kube_effect
    effect = kube_effect("annotate", "RayJob", "default", "j", annotations={"muster.dev/status": "y" * 100_000},
                         message="z" * 100_000)
    assert len(effect.annotations["muster.dev/status"]) == TEXT_CHARS and effect.message.endswith("...")


def test_a_policy_file_with_an_integer_beyond_the_int_string_limit_is_one_line(tmp_path):
    from shared.kernel.policy import Policy, PolicyError

    path = tmp_path / "policy.yaml"
    path.write_text("backoff_base_seconds: 0x" + "f" * 4400 + "\n")
    with pytest.raises(PolicyError, match=r"^invalid policy .*backoff_base_seconds: .*\(got a 17600-bit number\)$"):
        Policy.from_yaml(path)
