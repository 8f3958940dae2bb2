"""``shared.parts.kafka.cluster_id``: an id the storage tool takes as the value of ``-t``."""

from __future__ import annotations

import base64
import uuid

import pytest

from shared.parts import kafka


def test_an_id_never_starts_with_a_dash_which_the_tool_takes_for_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # URL-safe base64 of 0xf8... begins with "-"
    plain = uuid.UUID(bytes=b"\x01" * 16)
    drawn = iter([dashed, plain])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(drawn))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    assert kafka.cluster_id() == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")


def test_an_id_is_22_url_safe_characters() -> None:
    ids = {kafka.cluster_id() for _ in range(500)}
    assert len(ids) == 500
    assert all(len(i) == 22 and not i.startswith("-") and set(i) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for i in ids)
