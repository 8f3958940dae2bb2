"""shared/kernel/policy.py: one typed, frozen policy; unknown keys are errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.kernel.policy import Policy, PolicyError, QueuePolicy


def test_defaults_match_the_readme_table():
    p = Policy()
    assert p.model_dump() == {
        "queueing": "BestEffortFIFO", "placement": "binpack", "backoff_base_seconds": 1.0,
        "backoff_max_seconds": 60.0, "min_runtime_seconds": 0.0, "default_queue": "default",
        "unknown_queue": "wait", "scheduler_names": ("muster",), "max_gang_pods": 10000,
        "default_staleness_grace_period": 60.0, "overcommit_factor": 1.2, "queues": {},
    }


@pytest.mark.parametrize("value, seconds", [("60s", 60.0), ("2m", 120.0), (30, 30.0), ("0s", 0.0),
                                            ("-1s", None), (-1, None)])
def test_staleness_grace_period_is_written_as_kai_writes_it(value, seconds):
    """KAI's ``--default-staleness-grace-period``: a duration; a negative one never evicts."""
    p = Policy.from_mapping({"default_staleness_grace_period": value})
    assert p.staleness_grace_period_for("any") == seconds


def test_a_queue_overrides_the_staleness_grace_period():
    p = Policy.from_mapping({"default_staleness_grace_period": "2m",
                             "queues": {"train": {"staleness_grace_period": "-1s"}, "short": {"staleness_grace_period": 5}}})
    assert (p.staleness_grace_period_for("train"), p.staleness_grace_period_for("short"),
            p.staleness_grace_period_for("other")) == (None, 5.0, 120.0)


def test_policy_is_frozen():
    with pytest.raises(ValidationError):
        Policy().queueing = "StrictFIFO"  # type: ignore[misc]


def test_from_yaml_reads_every_key(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(
        "queueing: StrictFIFO\nplacement: spread\nbackoff_base_seconds: 2\nbackoff_max_seconds: 30\n"
        "min_runtime_seconds: 15\ndefault_queue: batch\nunknown_queue: reject\nscheduler_names: [muster, volcano]\n"
        "queues:\n  inference: {queueing: BestEffortFIFO, placement: binpack, min_runtime_seconds: 600}\n"
    )
    p = Policy.from_yaml(path)
    assert (p.queueing, p.placement, p.backoff_base_seconds, p.backoff_max_seconds, p.min_runtime_seconds,
            p.default_queue, p.unknown_queue, p.scheduler_names) == \
        ("StrictFIFO", "spread", 2.0, 30.0, 15.0, "batch", "reject", ("muster", "volcano"))
    assert p.queues == {"inference": QueuePolicy(queueing="BestEffortFIFO", placement="binpack",
                                                 min_runtime_seconds=600)}


@pytest.mark.parametrize("text", ["", "# nothing\n", "null\n"])
def test_empty_policy_file_is_the_defaults(tmp_path, text):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    assert Policy.from_yaml(path) == Policy()


@pytest.mark.parametrize("text, fragments", [
    ("queueng: StrictFIFO\n", ["invalid policy", "queueng", "Extra inputs are not permitted"]),
    ("queueing: Fair\n", ["invalid policy", "queueing", "StrictFIFO", "BestEffortFIFO"]),
    ("placement: diagonal\n", ["invalid policy", "placement", "binpack", "spread", "fragmentation"]),
    ("backoff_base_seconds: 0\n", ["invalid policy", "backoff_base_seconds", "greater than 0"]),
    ("min_runtime_seconds: -1\n", ["invalid policy", "min_runtime_seconds", "greater than or equal to 0"]),
    ("unknown_queue: ignore\n", ["invalid policy", "unknown_queue", "'wait' or 'reject'"]),
    ("queues: {q1: {placment: spread}}\n", ["invalid policy", "queues.q1.placment", "Extra inputs"]),
    ("queues: {q1: {placement: diagonal}}\n", ["invalid policy", "queues.q1.placement"]),
    ("queues: {q1: {min_runtime_seconds: -5}}\n", ["invalid policy", "queues.q1.min_runtime_seconds"]),
    ("default_staleness_grace_period: soon\n", ["invalid policy", "default_staleness_grace_period", "not a duration"]),
    ("queues: {q1: {staleness_grace_period: true}}\n", ["invalid policy", "queues.q1.staleness_grace_period"]),
    ("- StrictFIFO\n", ["invalid policy", "a policy is a mapping", "not a list"]),
    ("queueing: [\n", ["cannot read policy", "while parsing"]),
])
def test_from_yaml_errors_name_the_field(tmp_path, text, fragments):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as exc:
        Policy.from_yaml(path)
    message = str(exc.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message
    assert "\n" not in message and "errors.pydantic.dev" not in message  # the CLI prints it as one line


def test_from_yaml_missing_file(tmp_path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(PolicyError, match=r"^cannot read policy .*missing\.yaml: .*No such file"):
        Policy.from_yaml(path)


def test_from_mapping_none_is_defaults_and_unknown_key_raises():
    assert Policy.from_mapping(None) == Policy()
    with pytest.raises(ValidationError, match="bogus"):
        Policy.from_mapping({"bogus": 1})


@pytest.mark.parametrize("queue, queueing, placement, min_runtime", [
    ("inference", "StrictFIFO", "spread", 600.0),  # every field overridden
    ("half", "StrictFIFO", "binpack", 30.0),        # only queueing overridden
    ("zero", "BestEffortFIFO", "binpack", 0.0),     # min_runtime 0 overrides the global 30
    ("other", "BestEffortFIFO", "binpack", 30.0),   # no override: the global policy
])
def test_per_queue_overrides_fall_back_to_global(queue, queueing, placement, min_runtime):
    p = Policy.from_mapping({
        "min_runtime_seconds": 30,
        "queues": {
            "inference": {"queueing": "StrictFIFO", "placement": "spread", "min_runtime_seconds": 600},
            "half": {"queueing": "StrictFIFO"},
            "zero": {"min_runtime_seconds": 0},
        },
    })
    assert (p.queueing_for(queue), p.placement_for(queue), p.min_runtime_for(queue)) == \
        (queueing, placement, min_runtime)


def test_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


def test_scheduler_names_take_the_flag_form_and_an_unset_name_is_default_scheduler():
    p = Policy(scheduler_names="muster, volcano,muster")
    assert p.scheduler_names == ("muster", "volcano")
    assert p.answers_to("volcano") and p.answers_to("muster") and not p.answers_to("kai-scheduler")
    assert not p.answers_to(None) and not p.answers_to("")
    assert Policy(scheduler_names=["muster", "default-scheduler"]).answers_to(None)


@pytest.mark.parametrize("names", [[], "", ["muster", ""], [3]])
def test_scheduler_names_must_name_someone(names):
    with pytest.raises(ValidationError):
        Policy(scheduler_names=names)


def test_malformed_policy_yaml_is_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("queueing: StrictFIFO\nplacement: [binpack\n")
    with pytest.raises(PolicyError) as exc:
        Policy.from_yaml(path)
    message = str(exc.value)
    assert message.startswith(f"cannot read policy {path}:3:1: malformed YAML: ")
    assert "<unicode string>" not in message and "\n" not in message


def test_from_yaml_a_binary_file_is_a_policy_error(tmp_path):
    path = tmp_path / "policy.bin"
    path.write_bytes(b"abc\xff\xfe\x00")
    with pytest.raises(PolicyError, match=r"^cannot read policy .*policy\.bin: not UTF-8 text \(byte 0xff at offset 3\)$"):
        Policy.from_yaml(path)
