"""``muster replay --verify``'s first step: is this the log its signer wrote? (issue 33)

A chained log file (layout 2, written by ``muster log export`` from a store) holds, besides its header
and end line, two kinds of line::

    {"chain":"<link>","at":[P,O],"envelope":{...}}          an envelope: its link, its place (partition,
                                                              offset in the chain) and its bytes, unchanged
    {"muster_signed":{"kind":"checkpoint",...}}             a signed record (``shared.history.integrity``)

``check`` reads it twice. First every envelope line's place and link; then each line again: its link
must be SHA-256 of the link before it (its partition's previous offset) and its own bytes, its place
the next of its partition, and every signed record must verify, name a key that is introduced (and,
with ``--public-key``, trusted) and agree with the log: a checkpoint's link is the log's at its
offset, the header is the one signed, no checkpoint is missing from the run of them (each is numbered,
per partition), a simulated run ends with its final checkpoint. The first problem is
named by its line, in words an auditor can act on: edited, inserted, deleted, duplicated, reordered,
re-chained, cut. The formats are strict, byte for byte (a link in capitals, padding bits of base64,
a space in a signed line: all refused), so that no edit of the file leaves it verifying.

A witness file (``muster log checkpoints`` as some other party stored it) adds checkpoints the log
must agree with: a history rewritten and re-signed with a stolen key still disagrees with what was
witnessed before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shared.audit.errors import AuditError
from shared.audit.logfile import END_KEY, LogFile
from shared.history.integrity import GENESIS, canonical, key_id, link, signature_ok

TAMPERED = 7
"""``replay --verify``'s exit code for a log whose chain or signatures do not hold (shared/audit/errors.py)."""

CHAIN_KEY = b'{"chain":"'
SIGNED_KEY = b'{"muster_signed":'
_ENVELOPE_LINE = re.compile(rb'\{"chain":"([0-9a-f]{64})","at":\[(0|[1-9][0-9]*),(0|[1-9][0-9]*)\],"envelope":')


class Tampered(AuditError):
    """The log is not the one its signer wrote: the message names the first line that shows it."""

    exit_code = TAMPERED


@dataclass
class Verdict:
    """What the check found when the log holds: how much is chained and signed, and by whom."""

    envelopes: int = 0
    checkpoints: int = 0
    keys: list[str] = field(default_factory=list)
    authentic: bool = False
    """True when every signature was checked against a key the auditor gave (``--public-key``)."""
    unsigned: int = 0
    """Envelopes after the last checkpoint of their partition (a live log's latest, not yet signed)."""
    witnessed: int = 0
    notes: list[str] = field(default_factory=list)
    ends: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    """Each partition's last offset, its link and the signature of the checkpoint there ('' for none):
    where a log archived before this one's start goes on (``check(after=...)``)."""


def _strict_b64(text: Any, size: int) -> bytes | None:
    """Base64 of exactly ``size`` bytes, in the one spelling that encodes them (no stray padding bits)."""
    if not isinstance(text, str):
        return None
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if len(data) == size and base64.b64encode(data).decode() == text else None


def parse_signed(line: bytes, where: str) -> dict[str, Any]:
    """The record of a signed line, refused unless the line is exactly as the exporter writes it."""
    try:
        record = json.loads(line)["muster_signed"]
        exact = b'{"muster_signed":' + json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"}\n"
    except (ValueError, KeyError, TypeError):
        raise Tampered(f"{where}: a signed record that does not parse: the line was edited") from None
    if line != exact or not isinstance(record, dict):
        raise Tampered(f"{where}: a signed record not written as the exporter writes it: the line was edited")
    return record


@dataclass
class _Keys:
    """The keys the log introduces, and which of them the auditor's keys make trusted."""

    given: dict[str, Ed25519PublicKey]
    known: dict[str, Ed25519PublicKey] = field(default_factory=dict)
    trusted: set[str] = field(default_factory=set)

    def introduce(self, record: dict[str, Any], where: str) -> str:
        raw = _strict_b64(record.get("public_key"), 32)
        if raw is None:
            raise Tampered(f"{where}: a key record without a valid Ed25519 public key: the line was edited")
        public = Ed25519PublicKey.from_public_bytes(raw)
        kid = key_id(public)
        if record.get("key_id") != kid:
            raise Tampered(f"{where}: a key record whose key_id is not its key's: the line was edited")
        previous = record.get("previous")
        signer = public if previous is None else self.known.get(str(previous))
        if signer is None:
            raise Tampered(f"{where}: a key rotation signed by key {previous}, which the log does not introduce "
                           "before it: a line was deleted or moved")
        if record.get("key") != (kid if previous is None else previous) or not signature_ok(record, signer):
            raise Tampered(f"{where}: key {kid}'s record does not verify: the line was edited")
        first = not self.known
        self.known[kid] = public
        if kid in self.given or (previous is not None and previous in self.trusted) or (first and not self.given):
            self.trusted.add(kid)
        return kid

    def check(self, record: dict[str, Any], where: str) -> None:
        kid = str(record.get("key"))
        public = self.known.get(kid)
        if public is None:
            raise Tampered(f"{where}: signed by key {kid}, which the log does not introduce: a line was deleted, or "
                           "the record forged")
        if _strict_b64(record.get("signature"), 64) is None or not signature_ok(record, public):
            raise Tampered(f"{where}: its signature does not verify: the line was edited (or re-made without the key)")
        if kid not in self.trusted:
            raise Tampered(f"{where}: signed by key {kid}, " + (
                "which the given public key does not endorse (neither it nor a rotation signed by it): "
                "the log was re-signed by someone else" if self.given else
                "not the log's first key, and no rotation signed by the key before endorses it"))


def check(log: LogFile, public_keys: Iterable[Ed25519PublicKey] = (), witness: Iterable[dict[str, Any]] = (),
          *, sealed: bool | None = None, after: Mapping[int, tuple[int, str, str]] | None = None) -> Verdict:
    """Check ``log``'s chain and signed records (see the module docstring); ``Tampered`` naming the
    first line that shows an edit. ``sealed``: the log must end with a final checkpoint (a simulated
    run's; by default when its header says origin ``simulate``). ``after``: where the log's archive
    ends, per partition (offset, link; ``Verdict.ends`` of its check): a log whose records before
    were archived and pruned (``muster log archive --prune``) goes on from there, one chain; without
    it such a log is refused, as the start of a log cut off."""
    name = log.name
    header_line = log.header_line
    links: dict[tuple[int, int], str] = {}
    lines_of: dict[tuple[int, int], int] = {}
    starts: dict[int, int] = {}
    for number, line in log.raw_lines():
        if line.startswith(SIGNED_KEY) or line.startswith(END_KEY):
            continue
        m = _ENVELOPE_LINE.match(line)
        if m is None or not line.endswith(b"}\n"):
            raise Tampered(f"{name}: line {number}: not a chained envelope line ({{\"chain\":...,\"at\":[P,O],"
                           "\"envelope\":...}): the line was edited or inserted")
        place = (int(m[2]), int(m[3]))
        if place in lines_of:
            raise Tampered(f"{name}: line {number}: partition {place[0]} offset {place[1]} again (line "
                           f"{lines_of[place]} holds it): a line was duplicated or inserted")
        links[place] = m[1].decode()
        lines_of[place] = number
        starts[place[0]] = min(starts.get(place[0], place[1]), place[1])
    for p, first in starts.items():
        if first == 0:
            continue
        anchor = (after or {}).get(p)
        if anchor is None:
            raise Tampered(f"{name}: partition {p} starts at offset {first}, line {lines_of[(p, first)]}: lines before "
                           "it were deleted, or archived (`muster log archive`): pass the archive with --archive FILE")
        if anchor[0] != first - 1:
            raise Tampered(f"{name}: partition {p} starts at offset {first} but its archive ends at offset "
                           f"{anchor[0]}: the two are not one chain (lines missing between them)")
        links[(p, first - 1)] = anchor[1]
        linked = False
        for number, line in log.raw_lines():  # the checkpoint that links them must be in this log too
            if line.startswith(SIGNED_KEY) and b'"kind":"checkpoint"' in line:
                record = parse_signed(line, f"{name}: line {number}")
                if (record.get("partition"), record.get("offset")) == (p, first - 1):
                    linked = True
                    break
            elif line.startswith(CHAIN_KEY):
                break
        if not linked:
            raise Tampered(f"{name}: partition {p} starts at offset {first} without the checkpoint at offset "
                           f"{first - 1} that links it to its archive: a line was deleted")

    keys = _Keys({key_id(k): k for k in public_keys})
    verdict = Verdict(authentic=bool(keys.given))
    expected: dict[int, int] = {}
    last_checkpoint: dict[int, int] = {}
    counts: dict[int, int] = {}
    final: dict[int, bool] = {}
    headers: set[str | None] = {None}
    signed_header: dict[str, Any] | None = None
    place: tuple[int, int] | None = None
    """The last envelope line's: a checkpoint line follows the envelope it signs; keys and headers come first."""
    for number, line in log.raw_lines():
        where = f"{name}: line {number}"
        if line.startswith(END_KEY):
            continue
        if line.startswith(SIGNED_KEY):
            record = parse_signed(line, where)
            kind = record.get("kind")
            if kind in ("key", "header") and place is not None:
                raise Tampered(f"{where}: a {kind} record after the log's first envelope (the exporter writes them "
                               "first): the line was moved or inserted")
            if kind == "key":
                kid = keys.introduce(record, where)
                if kid in verdict.keys:
                    raise Tampered(f"{where}: key {kid} introduced again: a line was duplicated")
                verdict.keys.append(kid)
                continue
            keys.check(record, where)
            if kind == "header":
                signed_header = record.get("header")
                digest = hashlib.sha256(canonical(record)).hexdigest()
                if digest in headers:
                    raise Tampered(f"{where}: the same signed header again: a line was duplicated")
                headers.add(digest)
            elif kind == "checkpoint":
                signs = (record.get("partition"), record.get("offset"))
                archived = type(signs[1]) is int and signs[0] in starts and signs[1] < starts[signs[0]]  # type: ignore[operator]
                if archived and place is not None:
                    raise Tampered(f"{where}: a checkpoint of the archived part (offset {signs[1]}) after the log's "
                                   "first envelope (the exporter writes them first): the line was moved or inserted")
                if archived and (signs[0], signs[1]) not in links:
                    _archived(record, where, counts)
                elif signs != place and signs in links and not archived:  # one past the log's end is said so below
                    raise Tampered(f"{where}: a checkpoint of partition {record.get('partition')} offset "
                                   f"{record.get('offset')} away from that envelope's line (the exporter writes it "
                                   "right after): the line was moved or inserted")
                else:
                    _checkpoint(record, where, links, lines_of, last_checkpoint, counts, headers)
                p, o = record["partition"], record["offset"]
                if archived and (after or {}).get(p, (None,))[0] == o and after[p][2] != record.get("signature"):  # type: ignore[index]
                    raise Tampered(f"{where}: the checkpoint linking the archive to this log is not the archive's "
                                   "own (another signature): the archive is of another log, or re-signed")
                if (p, o) == place:
                    verdict.ends[p] = (o, links[(p, o)], str(record.get("signature")))
                last_checkpoint[p] = o
                counts[p] = counts.get(p, 0) + 1
                final[p] = bool(record.get("final"))
                verdict.checkpoints += 1
            else:
                raise Tampered(f"{where}: a signed record of unknown kind {kind!r}: the line was edited")
            continue
        m = _ENVELOPE_LINE.match(line)
        assert m is not None
        p, o = int(m[2]), int(m[3])
        raw = line[m.end():-2]
        prev = GENESIS if o == 0 else bytes.fromhex(links[(p, o - 1)]) if (p, o - 1) in links else None
        if prev is None:
            raise Tampered(f"{where}: offset {o - 1} of partition {p}, the one before this line's, is not in the log: "
                           "a line was deleted")
        if link(prev, raw).hex() != links[(p, o)]:
            raise Tampered(f"{where}: its bytes and link do not follow from the line before it in the chain (offset "
                           f"{o - 1}): this line was edited or inserted")
        if o != expected.get(p, starts[p]):
            raise Tampered(f"{where}: offset {o} of partition {p} where offset {expected.get(p, starts[p])} belongs: "
                           "lines were reordered (or this one moved)")
        expected[p] = o + 1
        place = (p, o)
        verdict.ends[p] = (o, links[(p, o)], "")
        verdict.envelopes += 1

    _header(log, header_line, signed_header, verdict)
    for p, end in expected.items():
        top = last_checkpoint.get(p)
        if top is None:
            if verdict.keys or sealed:
                raise Tampered(f"{name}: partition {p} has no signed checkpoint: the log's checkpoints were removed")
            continue
        if top < end - 1:
            verdict.unsigned += end - 1 - top
    must_seal = log.header.origin == "simulate" if sealed is None else sealed
    if must_seal:
        for p, end in expected.items():
            if not final.get(p) or last_checkpoint.get(p) != end - 1:
                raise Tampered(f"{name}: the run's final checkpoint of partition {p} is missing (the signed "
                               f"checkpoints reach offset {last_checkpoint.get(p)}, the log offset {end - 1}): the log "
                               "was cut short, its end line made again")
    for record in witness:
        if record.get("kind") == "checkpoint":
            _witnessed(record, name, links, lines_of)
            verdict.witnessed += 1
    if not verdict.keys:
        verdict.notes.append("the log carries no signed records: its chain holds together, but nothing says who "
                             "wrote it")
    elif not keys.given:
        verdict.notes.append("authenticity not checked: no --public-key given (the signatures were checked against "
                             "the key the log itself names; `muster log key` prints the signer's)")
    return verdict


def _archived(record: dict[str, Any], where: str, counts: dict[int, int]) -> None:
    """A checkpoint of records archived before the log's start: its place in the run of checkpoints
    only (its link is the archive's to check)."""
    p = record.get("partition")
    if record.get("number") != counts.get(p, 0):  # type: ignore[arg-type]
        raise Tampered(f"{where}: checkpoint number {record.get('number')} of partition {p} where number "
                       f"{counts.get(p, 0)} belongs: a checkpoint line was deleted, repeated or moved")  # type: ignore[arg-type]


def _checkpoint(record: dict[str, Any], where: str, links: dict[tuple[int, int], str],
                lines_of: dict[tuple[int, int], int], last: dict[int, int], counts: dict[int, int],
                headers: set[str | None]) -> None:
    p, o, chain = record.get("partition"), record.get("offset"), record.get("chain")
    if type(p) is not int or type(o) is not int or not isinstance(chain, str):
        raise Tampered(f"{where}: a checkpoint without partition, offset and chain: the line was edited")
    if record.get("number") != counts.get(p, 0):
        raise Tampered(f"{where}: checkpoint number {record.get('number')} of partition {p} where number "
                       f"{counts.get(p, 0)} belongs: a checkpoint line was deleted, repeated or moved")
    if record.get("header") not in headers:
        raise Tampered(f"{where}: this checkpoint was signed after a header the log does not hold: the signed header "
                       "was removed or replaced")
    held = links.get((p, o))
    if held is None:
        raise Tampered(f"{where}: a checkpoint of partition {p} offset {o}, which the log no longer reaches: the log "
                       "was cut short (or lines deleted)")
    if held != chain:
        since = last.get(p, -1) + 1
        raise Tampered(f"{where}: the log's link at offset {o} (line {lines_of[(p, o)]}) is not the one this checkpoint "
                       f"signed: the log between line {lines_of.get((p, since), '?')} and line {lines_of[(p, o)]} "
                       f"(offsets {since} to {o}, after the checkpoint before) was rewritten and re-chained")


def _header(log: LogFile, line: bytes, signed: dict[str, Any] | None, verdict: Verdict) -> None:
    name = log.name
    if line != log.header.line():
        raise Tampered(f"{name}: line 1: the header is not written as the exporter writes it: it was edited")
    if signed is None:
        if verdict.keys:
            verdict.notes.append("the header is not signed (the projector ran without --policy): its fields are "
                                 "the exporter's")
        return
    mine = log.header.for_store()
    differs = sorted(k for k in set(mine) | set(signed) if mine.get(k) != signed.get(k))
    if differs:
        raise Tampered(f"{name}: line 1: header field{'s' if len(differs) > 1 else ''} {', '.join(differs)} "
                       "differ from the signed header: the header was edited")


def _witnessed(record: dict[str, Any], name: str, links: dict[tuple[int, int], str],
               lines_of: dict[tuple[int, int], int]) -> None:
    p, o = record.get("partition"), record.get("offset")
    what = f"the witnessed checkpoint of partition {p} offset {o} ({record.get('time')})"
    held = links.get((p, o))  # type: ignore[arg-type]
    if held is None:
        raise Tampered(f"{name}: the log no longer reaches {what}: it was cut short or rewritten")
    if held != record.get("chain"):
        raise Tampered(f"{name}: line {lines_of[(p, o)]}: the log disagrees with {what}: its history up to there was "  # type: ignore[index]
                       "rewritten since it was witnessed")


def read_witness(path: Path) -> list[dict[str, Any]]:
    """The checkpoints of a witness file: JSON Lines as ``muster log checkpoints`` prints them."""
    out = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditError(f"cannot read the witness file {path}: {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise AuditError(f"{path}: line {number}: not JSON (a witness file holds `muster log checkpoints` "
                             "lines)") from None
        out.append(record.get("muster_signed", record) if isinstance(record, dict) else {})
    return out


def summary(verdict: Verdict) -> str:
    keys = ", ".join(verdict.keys) or "none"
    text = (f"{verdict.envelopes:,} envelopes chained, {verdict.checkpoints:,} signed checkpoints, key "
            f"{keys} ({'checked against the given public key' if verdict.authentic else 'authenticity not checked'})")
    if verdict.witnessed:
        text += f", {verdict.witnessed} witnessed checkpoints agree"
    if verdict.unsigned:
        text += f"; {verdict.unsigned:,} envelopes after the last checkpoint are chained but not yet signed"
    return text


def trusted_keys(paths: Iterable[Path]) -> list[Ed25519PublicKey]:
    from shared.history.integrity import load_public

    return [load_public(p) for p in paths]


def chain_lines(raws: Iterator[tuple[bytes, int, int, str]], signed: list[dict[str, Any]],
                starts: Mapping[int, int] | None = None) -> Iterator[bytes]:
    """An exported chained log's lines (no newline): the keys and the header record first, then the
    checkpoints of what was archived before each partition's ``starts`` (a pruned store), then each
    envelope followed by the checkpoints of its place. ``raws``: (bytes, partition, offset, link)."""
    from shared.history.integrity import envelope_line, record_line

    at: dict[tuple[int, int], list[dict[str, Any]]] = {}
    archived = []
    for record in signed:
        if record.get("kind") == "checkpoint":
            if record["offset"] < (starts or {}).get(record["partition"], 0):
                archived.append(record)
            else:
                at.setdefault((record["partition"], record["offset"]), []).append(record)
        else:
            yield record_line(record)[:-1]
    for record in archived:
        yield record_line(record)[:-1]
    for raw, p, o, chain in raws:
        yield envelope_line(p, o, chain, raw)[:-1]
        for record in at.pop((p, o), ()):
            yield record_line(record)[:-1]
    for records in at.values():  # a checkpoint past the rows held (none, unless the store was edited)
        for record in records:
            yield record_line(record)[:-1]


__all__ = ["TAMPERED", "Tampered", "Verdict", "check", "chain_lines", "read_witness", "summary", "trusted_keys"]
