"""shared/kernel/events.py: the envelope, deterministic ids, JSON round trips, upcasting, JSON Schema."""

from __future__ import annotations

import json
import typing

import pytest
from pydantic import ValidationError

from shared.kernel.events import (
    PAYLOAD_TYPES, SCHEMA_VERSION, Envelope, KubeEffect, ObjectChanged, Payload, TimerSet, WorkloadDeleted,
    derive_id, from_json, json_schemas, kube_effect, to_json, upcast, wrap,
)
from shared.kernel.fastmodel import built
from tests.builders.shared import at, sample_payloads

SAMPLES = sample_payloads()


def test_samples_cover_every_payload_type_and_the_union():
    union_members = typing.get_args(typing.get_args(Payload)[0])
    assert {cls.model_fields["type"].default for cls in union_members} == set(PAYLOAD_TYPES)
    assert set(SAMPLES) == set(PAYLOAD_TYPES)
    assert len(PAYLOAD_TYPES) == 32
    assert SCHEMA_VERSION == 1


# --------------------------------------------------------------------------- derive_id
def test_derive_id_pinned_values():
    """A change of hash function, digest size or separator changes every stored id: catch it here."""
    assert derive_id("queue", 1.0, 0, "TimerSet", "timer/k") == "8137d84d9b9310d1582dbc93"
    assert derive_id("admission", "8137d84d9b9310d1582dbc93", 2) == "41ef8571645d3cb583b8fa36"
    assert derive_id("a", 1, "b") == "eb6eaf2b6dfa4de16e62935a"


def test_derive_id_is_24_hex_chars_and_input_sensitive():
    ids = {derive_id("s", "cause", i) for i in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 24 and int(i, 16) >= 0 for i in ids)
    assert derive_id("s", "cause", 0) == derive_id("s", "cause", 0)
    assert derive_id("s", "cause", 0) != derive_id("t", "cause", 0)


# --------------------------------------------------------------------------- wrap
def test_wrap_without_cause_derives_id_from_source_time_index_type_subject():
    env = wrap(TimerSet(key="k", at=5.0), source="queue", cause=None, index=0, at=1.0)
    assert env.id == "8137d84d9b9310d1582dbc93"
    assert (env.type, env.subject, env.source, env.occurred_at, env.causation_id, env.correlation_id,
            env.schema_version, env.trace) == \
        ("TimerSet", "timer/k", "queue", 1.0, None, env.id, SCHEMA_VERSION, {})


def test_wrap_without_cause_needs_a_time():
    with pytest.raises(ValueError, match="an event with no cause needs an explicit time"):
        wrap(TimerSet(key="k", at=5.0), source="queue", cause=None, index=0)


def test_wrap_with_cause_inherits_time_correlation_and_trace():
    cause = Envelope(**{**at(TimerSet(key="k", at=5.0), 1.0, source="queue").model_dump(),
                        "trace": {"traceparent": "00-abc-def-01"}})
    child = wrap(WorkloadDeleted(key="ns/w"), source="admission", cause=cause, index=2)
    assert child.id == derive_id("admission", cause.id, 2) == "41ef8571645d3cb583b8fa36"
    assert (child.type, child.subject, child.source, child.occurred_at, child.causation_id, child.correlation_id) == \
        ("WorkloadDeleted", "ns/w", "admission", 1.0, cause.id, cause.id)
    assert child.trace == {"traceparent": "00-abc-def-01"} and child.trace is not cause.trace
    later = wrap(WorkloadDeleted(key="ns/w"), source="admission", cause=cause, index=2, at=9.5)
    assert later.occurred_at == 9.5 and later.id == child.id  # time does not enter a caused id


def test_wrap_is_deterministic():
    a = wrap(WorkloadDeleted(key="ns/w"), source="s", cause=None, index=3, at=2.0)
    b = wrap(WorkloadDeleted(key="ns/w"), source="s", cause=None, index=3, at=2.0)
    assert a == b and to_json(a) == to_json(b)
    assert wrap(WorkloadDeleted(key="ns/v"), source="s", cause=None, index=3, at=2.0).id != a.id


# --------------------------------------------------------------------------- subjects
@pytest.mark.parametrize("type_, subject", [
    ("ObjectChanged", "Pod/team-a/p1"),
    ("QueueDefined", "queue/q1"),
    ("QueueRemoved", "queue/q1"),
    ("QueueRejected", "queue/q2"),
    ("WorkloadSubmitted", "team-a/rc"),
    ("WorkloadUpdated", "team-a/rc"),
    ("WorkloadRejected", "team-a/bad"),
    ("Dequeued", "team-a/rc"),
    ("PreemptionRequested", "team-b/x"),
    ("CapacityChanged", "cluster"),
    ("KubeEffect", "RayCluster/team-a/rc"),
    ("TimerSet", "timer/cycle"),
    ("TimerFired", "timer/cycle"),
])
def test_subjects(type_, subject):
    assert SAMPLES[type_].subject == subject
    assert at(SAMPLES[type_], 0.0).subject == subject


def test_object_changed_subject_without_namespace():
    from services.reconciler.ingest import observe
    from tests.builders import node
    assert observe("Added", node("n1")).subject == "Node/n1"


# --------------------------------------------------------------------------- JSON
@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_json_round_trip_every_payload(type_):
    cause = at(TimerSet(key="k", at=1.0), 0.5, source="queue")
    env = wrap(SAMPLES[type_], source="placement", cause=cause, index=1, at=2.25)
    data = to_json(env)
    back = from_json(data)
    assert back == env
    assert type(back.payload) is PAYLOAD_TYPES[type_]
    assert to_json(back) == data
    assert from_json(data.decode()) == env  # str as well as bytes


def test_to_json_field_order_and_values():
    env = wrap(WorkloadDeleted(key="ns/w"), source="admission", cause=None, index=0, at=1.0)
    assert json.loads(to_json(env)) == {
        "id": env.id, "type": "WorkloadDeleted", "subject": "ns/w", "source": "admission", "occurred_at": 1.0,
        "causation_id": None, "correlation_id": env.id, "schema_version": 1, "trace": {},
        "payload": {"key": "ns/w", "type": "WorkloadDeleted", "reason": "deleted by its owner"},
    }
    assert list(json.loads(to_json(env))) == ["id", "type", "subject", "source", "occurred_at", "causation_id",
                                              "correlation_id", "schema_version", "trace", "payload"]


# the writer ``to_json`` uses must write exactly what ``Envelope``'s own serializer writes
_ODD_OBJECT = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan"), "big": 10 ** 30, "tiny": 1.5e-7,
               "e16": 1e16, "neg0": -0.0, "text": "é\u2028\"\\\x01\ud7ff", "flags": [True, 1, 1.0, None], "t": (1, 2)}


@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_to_json_writes_what_the_envelope_serializer_writes(type_):
    cause = at(TimerSet(key="k", at=1.0), 0.5, source="queue")
    for when in (2.25, float("inf"), 1e16, -0.0):
        env = wrap(SAMPLES[type_], source="placement", cause=cause, index=1, at=when)
        assert to_json(env) == Envelope.__pydantic_serializer__.to_json(env)


def test_to_json_of_odd_values_in_a_watched_object_matches_the_envelope_serializer():
    env = wrap(ObjectChanged(change="Added", kind="X", name="n", object=_ODD_OBJECT), source="ingest", cause=None,
               index=0, at=float("nan"))
    data = to_json(env)
    assert data == Envelope.__pydantic_serializer__.to_json(env)
    assert b'"inf":Infinity' in data and b'"nan":NaN' in data  # constants, as the envelope's config says


def test_to_json_of_an_envelope_laid_out_otherwise_uses_the_envelope_serializer():
    env = wrap(WorkloadDeleted(key="ns/w"), source="admission", cause=None, index=0, at=1.0)
    reordered = built(Envelope, dict(reversed(list(env.__dict__.items()))))
    assert to_json(reordered) == Envelope.__pydantic_serializer__.to_json(reordered)
    missing = built(Envelope, {k: v for k, v in env.__dict__.items() if k != "trace"})
    assert to_json(missing) == Envelope.__pydantic_serializer__.to_json(missing, warnings=False)

    class Sub(WorkloadDeleted):
        pass

    sub = built(Envelope, {**env.__dict__, "payload": Sub(key="ns/w")})
    assert to_json(sub) == Envelope.__pydantic_serializer__.to_json(sub, warnings=False)


def _raw() -> dict:
    return json.loads(to_json(wrap(WorkloadDeleted(key="ns/w"), source="admission", cause=None, index=0, at=1.0)))


@pytest.mark.parametrize("data", ["[1]", '"x"', "1", "null", "true", b"[]"])
def test_from_json_rejects_non_objects(data):
    with pytest.raises(ValueError, match="^an envelope must be a JSON object$"):
        from_json(data)


def test_from_json_rejects_invalid_json():
    with pytest.raises(json.JSONDecodeError):
        from_json(b"{not json")


@pytest.mark.parametrize("mutate, where", [
    (lambda r: r["payload"].update(type="Nope"), "payload"),
    (lambda r: r["payload"].update(bogus=1), "payload.WorkloadDeleted.bogus"),
    (lambda r: r["payload"].pop("key"), "payload.WorkloadDeleted.key"),
    (lambda r: r["payload"].pop("type"), "payload"),
    (lambda r: r.update(payload={"type": "KubeEffect", "op": "explode", "kind": "Pod", "namespace": "n",
                                 "name": "p"}), "payload.KubeEffect.op"),
    (lambda r: r.update(payload={"type": "TimerSet", "key": "k", "at": "soon"}), "payload.TimerSet.at"),
    (lambda r: r.pop("id"), "id"),
    (lambda r: r.pop("correlation_id"), "correlation_id"),
    (lambda r: r.update(extra_field=1), "extra_field"),
    (lambda r: r.update(occurred_at="yesterday"), "occurred_at"),
])
def test_from_json_bad_payloads_are_validation_errors(mutate, where):
    raw = _raw()
    mutate(raw)
    with pytest.raises(ValidationError) as exc:
        from_json(json.dumps(raw))
    assert where in {".".join(str(p) for p in e["loc"]) for e in exc.value.errors()}


def test_from_json_missing_schema_version_means_current():
    raw = _raw()
    del raw["schema_version"]
    assert from_json(json.dumps(raw)).schema_version == SCHEMA_VERSION


def test_upcast_rejects_newer_versions_and_passes_current_through():
    raw = _raw()
    assert upcast(raw) is raw
    assert upcast({"no": "version"}) == {"no": "version"}
    raw["schema_version"] = 2
    with pytest.raises(ValueError, match=r"^event schema version 2 is newer than this muster \(1\)$"):
        upcast(raw)
    with pytest.raises(ValueError, match="newer"):
        from_json(json.dumps(raw))


@pytest.mark.parametrize("version", [0, -1])
def test_upcast_rejects_versions_before_the_first(version):
    raw = _raw()
    raw["schema_version"] = version
    with pytest.raises(ValueError, match=rf"^event schema version {version} is unknown \(versions start at 1\)$"):
        upcast(raw)
    with pytest.raises(ValueError, match="unknown"):
        from_json(json.dumps(raw))


@pytest.mark.parametrize("version", [None, "abc", "2", [1]])
def test_from_json_non_integer_schema_version_is_a_value_error(version):
    raw = _raw()
    raw["schema_version"] = version
    with pytest.raises(ValueError):  # ValidationError is a ValueError; "2" must not slip past the version check
        from_json(json.dumps(raw))


def test_from_json_rejects_envelope_type_that_disagrees_with_payload():
    raw = _raw()
    raw["type"] = "TimerSet"  # payload is a WorkloadDeleted
    with pytest.raises(ValidationError):
        from_json(json.dumps(raw))


def test_envelope_is_frozen():
    env = _raw()
    model = from_json(json.dumps(env))
    with pytest.raises(ValidationError):
        model.id = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------- JSON Schema
def test_json_schemas_cover_envelope_and_every_payload():
    schemas = json_schemas()
    assert set(schemas) == set(PAYLOAD_TYPES) | {"Envelope"}
    for name, schema in schemas.items():
        assert schema["title"] == name
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        json.dumps(schema)  # serialisable
    for name in PAYLOAD_TYPES:
        assert schemas[name]["properties"]["type"]["const"] == name


def test_envelope_schema_discriminates_payload_by_type():
    schema = json_schemas()["Envelope"]
    payload = schema["properties"]["payload"]
    assert payload["discriminator"]["propertyName"] == "type"
    assert set(payload["discriminator"]["mapping"]) == set(PAYLOAD_TYPES)
    assert set(schema["required"]) == {"id", "type", "subject", "source", "occurred_at", "correlation_id", "payload"}


@pytest.mark.parametrize("fields", [
    {"op": "bind", "kind": "Pod", "namespace": "ns", "name": "p", "node": "n1",
     "annotations": {"muster.dev/gpu-devices": "0,1"}},
    {"op": "event", "kind": "RayJob", "namespace": "ns", "name": "j", "reason": "Queued", "message": "waiting",
     "event_type": "Warning"},
    {"op": "status", "kind": "Queue", "namespace": "", "name": "q", "api_version": "scheduling.volcano.sh/v1beta1",
     "status": {"state": "Open", "allocated": {"cpu": "2"}, "gone": None}},
    {"op": "unsuspend", "kind": "", "namespace": "default", "name": "w"},
])
def test_kube_effect_is_the_validated_effect_byte_for_byte(fields):
    fast, checked = kube_effect(**fields), KubeEffect(**fields)
    assert fast == checked and fast.__dict__ == checked.__dict__
    assert list(fast.__dict__) == list(KubeEffect.model_fields)
    cause = at(WorkloadDeleted(key="ns/w"), 1.0)
    assert to_json(wrap(fast, source="reconciler", cause=cause, index=0)) == \
        to_json(wrap(checked, source="reconciler", cause=cause, index=0))


def test_kube_effect_copies_its_mappings_as_validation_does():
    annotations, status = {"a": "1"}, {"phase": "Running"}
    effect = kube_effect(op="status", kind="PodGroup", namespace="ns", name="g", annotations=annotations, status=status)
    annotations["b"], status["x"] = "2", 1
    assert effect.annotations == {"a": "1"} and effect.status == {"phase": "Running"}


@pytest.mark.parametrize("odd", [{"op": "delete"}, {"annotations": {"a": 1}}, {"name": None}, {"event_type": "Info"},
                                 {"status": {1: "x"}}])
def test_kube_effect_validates_what_is_not_exactly_typed(odd):
    fields = {"op": "annotate", "kind": "Pod", "namespace": "ns", "name": "p", **odd}
    try:
        expected = KubeEffect(**fields)
    except ValidationError:
        with pytest.raises(ValidationError):
            kube_effect(**fields)
    else:
        got = kube_effect(**fields)
        assert got == expected and to_json(at(got, 1.0)) == to_json(at(expected, 1.0))


def test_built_is_model_construct_of_every_field() -> None:
    """``built`` sets ``BaseModel``'s slots through their own setters: the model is the one
    ``model_construct`` makes of the same fields, down to its set fields, extra and private parts."""
    cause = at(WorkloadDeleted(key="ns/w"), 1.0)
    env = wrap(kube_effect(op="event", kind="RayJob", namespace="ns", name="w", reason="R"),
               source="reconciler", cause=cause, index=0)
    slow = Envelope.model_construct(**env.__dict__)
    for fast, made in ((env, slow), (env.payload, KubeEffect.model_construct(**env.payload.__dict__))):
        assert fast == made and fast.__dict__ == made.__dict__ and repr(fast) == repr(made)
        assert fast.model_fields_set == made.model_fields_set
        assert (fast.__pydantic_extra__, fast.__pydantic_private__) == (made.__pydantic_extra__, made.__pydantic_private__)
        assert fast.model_copy() == made.model_copy() and fast.model_dump() == made.model_dump()
    assert to_json(env) == to_json(slow)
