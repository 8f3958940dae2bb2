"""shared/bus/codec.py: envelopes and control messages as records, bad records, dead letters."""

from __future__ import annotations

import base64
import json

import pytest

from shared.bus.codec import (
    CONTROL_HEADER, BadRecord, Finished, Release, control_kind, dead_letter, decode, encode, encode_control,
    envelope_headers,
)
from shared.events import ObjectChanged, WorkloadDeleted
from tests.builders.shared import at


def _env():
    return at(WorkloadDeleted(key="default/w"), 1.0)


def test_an_envelope_round_trips():
    env = _env()
    assert decode(encode(env), envelope_headers(env)) == env


def test_infinity_inside_a_watched_object_survives_the_round_trip():
    env = at(ObjectChanged(change="Added", kind="Pod", namespace="ns", name="p",
                           object={"spec": {"cpu": float("inf")}}), 1.0)
    decoded = decode(encode(env))
    assert decoded == env
    assert decoded.payload.object["spec"]["cpu"] == float("inf")


@pytest.mark.parametrize("message", [Release(round=3, ids=("a", "b")), Finished(round=3, service="queue", log_offset=7)])
def test_a_control_message_round_trips(message):
    assert decode(*encode_control(message)) == message


def test_control_kind_names_control_records_only():
    assert control_kind(encode_control(Release(0, ()))[1]) == "release"
    assert control_kind(encode_control(Finished(0, "queue", -1))[1]) == "finished"
    assert control_kind(envelope_headers(_env())) is None
    assert control_kind(None) is None


@pytest.mark.parametrize("value", [None, b"\xff\xfe\x00", b"not json", b"[1, 2]", b'"text"'],
                         ids=["none", "non-json-bytes", "not-json", "array", "string"])
def test_a_record_that_is_no_envelope_is_a_bad_record(value):
    with pytest.raises(BadRecord):
        decode(value)


def test_an_invalid_envelope_names_the_field():
    raw = json.loads(encode(_env()))
    del raw["correlation_id"]
    with pytest.raises(BadRecord, match="correlation_id"):
        decode(json.dumps(raw).encode())


def test_a_release_with_non_string_ids_is_a_bad_record():
    with pytest.raises(BadRecord, match="release"):
        decode(b'{"round": 0, "ids": [1, 2]}', [(CONTROL_HEADER, b"release")])


def test_an_unknown_control_kind_is_a_bad_record():
    with pytest.raises(BadRecord, match="pause"):
        decode(b"{}", [(CONTROL_HEADER, b"pause")])


def _dead(value: bytes) -> dict:
    return json.loads(dead_letter(value, [("muster-type", b"X")], topic="muster.queue", partition=0, offset=42,
                                  consumer="queue", error="boom"))


def test_a_dead_letter_says_where_the_record_was_read_and_why():
    assert _dead(b"{oops") == {
        "topic": "muster.queue", "partition": 0, "offset": 42, "consumer": "queue", "error": "boom",
        "value": "{oops", "value_encoding": "utf-8", "headers": {"muster-type": "X"},
    }


def test_a_dead_letter_keeps_non_utf8_bytes_as_base64():
    letter = _dead(b"\xff\x00\xfe")
    assert letter["value_encoding"] == "base64"
    assert base64.b64decode(letter["value"]) == b"\xff\x00\xfe"
