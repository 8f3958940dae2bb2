"""For random chained logs and a random single edit of the file — one byte changed, a line deleted,
duplicated, moved, two lines swapped, a line inserted — ``muster replay --verify``'s chain check never
passes the edited log (``shared.audit.integrity``; the decisions are checked after it and are not
needed here: the logs hold arbitrary bytes for envelopes)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.audit.errors import AuditError
from shared.audit.header import CHAINED, LogHeader
from shared.audit.integrity import chain_lines, check
from shared.audit.logfile import LogFile
from shared.history.integrity import Chainer, Signer, digest

SIGNER = Signer.generate()


def chained_file(envelopes: list[bytes], every: int) -> bytes:
    """A chained log as the exporter writes one of a simulated run signed by ``SIGNER``."""
    header = LogHeader.made_now(None, origin="simulate", scenario="random", until=1.0).model_copy(
        update={"muster_log": CHAINED})
    chainer = Chainer(SIGNER, "test", every=every, seconds=1e9)
    header_record = SIGNER.header_record(header.for_store())
    chainer.header = digest(header_record)
    signed = [SIGNER.key_record(), header_record]
    rows = []
    for raw in envelopes:
        offset, value = chainer.add(0, raw)
        rows.append((raw, 0, offset, value.hex()))
        signed += chainer.due()
    signed += chainer.seal()
    body = [line + b"\n" for line in chain_lines(iter(rows), signed)]
    return header.line() + b"".join(body) + b'{"muster_log_end":{"events":%d}}\n' % len(envelopes)


def passes(data: bytes) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.jsonl"
        path.write_bytes(data)
        try:
            log = LogFile(path)
            check(log)
            for _ in log.records():
                pass
        except AuditError:
            return False
    return True


envelope = st.dictionaries(st.sampled_from(["id", "type", "subject", "occurred_at"]),
                           st.one_of(st.integers(0, 99), st.text("abc", max_size=4)), min_size=1).map(
    lambda d: __import__("json").dumps(d, separators=(",", ":")).encode())
logs = st.tuples(st.lists(envelope, min_size=1, max_size=12), st.integers(1, 5))


@st.composite
def edited(draw: st.DrawFn) -> tuple[bytes, bytes]:
    envelopes, every = draw(logs)
    original = chained_file(envelopes, every)
    lines = original.splitlines(keepends=True)
    kind = draw(st.sampled_from(["byte", "delete", "duplicate", "move", "swap", "insert"]))
    i = draw(st.integers(0, len(lines) - 1))
    j = draw(st.integers(0, len(lines) - 1))
    if kind == "byte":
        data = bytearray(original)
        at = draw(st.integers(0, len(data) - 1))
        data[at] ^= draw(st.integers(1, 255))
        return original, bytes(data)
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(j, lines[i])
    elif kind == "move":
        lines.insert(j, lines.pop(i))
    elif kind == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines.insert(j, draw(st.sampled_from([b"{}\n", b'{"chain":"00","at":[0,0],"envelope":{}}\n',
                                              b'{"muster_signed":{}}\n', lines[i][:-1] + b" \n"])))
    return original, b"".join(lines)


def test_an_unedited_random_log_passes() -> None:
    assert passes(chained_file([b'{"id":1}', b'{"id":2}', b'{"id":3}'], 2))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited())
def test_no_single_edit_passes(case: tuple[bytes, bytes]) -> None:
    original, data = case
    if data != original:
        assert not passes(data)
