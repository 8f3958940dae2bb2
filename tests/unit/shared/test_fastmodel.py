"""shared/kernel/fastmodel.py: what the craft relies on in the pinned pydantic still holds, and so
does what shared/runtime/statecodec.py relies on under the same pin (a model's pickled state).

A pydantic that lays its models or schemas out otherwise fails here, loudly, rather than making
models that differ from validated ones, writing other bytes into the log, falling back to the
slow serializer unnoticed, or restoring a snapshot's models with parts of their state left empty.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pydantic
import pydantic_core
import pytest
from pydantic import BaseModel

from shared.kernel import fastmodel
from shared.kernel.events import PAYLOAD_TYPES, Envelope, TimerSet, to_json, wrap
from shared.kernel.fastmodel import built, narrowed, writer
from shared.runtime import statecodec
from tests.builders.shared import at, sample_payloads

SAMPLES = sample_payloads()
ROOT = Path(__file__).resolve().parents[3]
STATE_KEYS = ("__dict__", "__pydantic_extra__", "__pydantic_fields_set__", "__pydantic_private__")
"""A model's ``__getstate__``, as statecodec writes it and hands it back to ``__setstate__``."""


def _envelopes(payload: BaseModel) -> tuple[Envelope, Envelope]:
    """``payload`` enveloped as an output (with a cause) and as an input (none, infinite time)."""
    cause = at(TimerSet(key="k", at=1.0), 0.5, source="queue")
    return (wrap(payload, source="placement", cause=cause, index=1),
            wrap(payload, source="ingest", cause=None, index=3, at=float("inf")))


def test_the_installed_pydantic_is_the_one_pinned_and_checked():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [p for p in pins if re.match(r"pydantic\b", p)]
    assert pin == f"pydantic=={fastmodel.PYDANTIC_VERSION}"
    assert pydantic.VERSION == fastmodel.PYDANTIC_VERSION
    assert pydantic_core.__version__ == fastmodel.PYDANTIC_CORE_VERSION


@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_built_equals_the_validated_model(type_):
    sample = SAMPLES[type_]
    cls = type(sample)
    validated = cls.model_validate(sample.model_dump())
    fast = built(cls, dict(validated.__dict__))
    assert fast == validated and fast.__dict__ == validated.__dict__ and repr(fast) == repr(validated)
    assert fast.model_fields_set == set(cls.model_fields)
    assert (fast.__pydantic_extra__, fast.__pydantic_private__) == (validated.__pydantic_extra__,
                                                                    validated.__pydantic_private__)
    assert fast.model_dump_json() == validated.model_dump_json()
    assert fast.model_copy() == validated.model_copy()


@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_an_envelope_built_equals_it_validated_and_writes_the_same_json(type_):
    for env in _envelopes(SAMPLES[type_]):
        validated = Envelope.model_validate(env.model_dump())
        assert env == validated and env.model_fields_set == validated.model_fields_set
        assert to_json(env) == env.model_dump_json().encode() == validated.model_dump_json().encode()


@pytest.mark.parametrize("cls", sorted(PAYLOAD_TYPES.values(), key=lambda c: c.__name__))
def test_every_payload_type_has_its_fast_writer(cls):
    """The schema is laid out as ``narrowed`` reads it: no payload falls back to the slow serializer."""
    assert narrowed(Envelope, "payload", cls) is not None


def test_a_writer_falls_back_to_the_model_serializer_for_what_is_no_member():
    assert narrowed(Envelope, "payload", Envelope) is None
    assert narrowed(Envelope, "no-such-field", TimerSet) is None
    write = writer(Envelope, "payload")
    env = at(TimerSet(key="k", at=1.0), 0.5)
    assert write(env) == env.model_dump_json().encode()


@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_a_models_state_is_laid_out_as_the_state_codec_reads_it(type_):
    """statecodec writes a model from its ``__getstate__`` and restores it by ``__setstate__``, which
    reads each key with a default: a key renamed or added would come back empty or be lost unnoticed."""
    for model in (SAMPLES[type_], *_envelopes(SAMPLES[type_])):
        assert tuple(model.__getstate__()) == STATE_KEYS
        back = statecodec.decode(statecodec.encode(model))
        assert type(back) is type(model) and back == model and back.__getstate__() == model.__getstate__()
        assert back.model_dump_json() == model.model_dump_json()
