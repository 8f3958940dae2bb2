"""``muster log archive --until T --out FILE [--prune]``: the store's log before T as a verified, chained,
signed file, and (``--prune``) those records gone from the store, the chain unbroken between the two.

The cut falls on a signed checkpoint: the last one of each partition whose envelopes are all at or
before T (event time). That checkpoint links the archive to what remains: the records after it
chain on from its link, and an export of the pruned store carries it (with the checkpoints before
it) ahead of its first envelope. ``muster replay LIVE --verify --archive FILE`` checks the archive's
chain, then the live log's as its continuation (one chain, or the first line that breaks it), then
re-derives the decisions of both, read as one log. Nothing is pruned unless the archive, written to a
temporary name, verifies and is renamed into place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from shared.audit.errors import CannotReproduce, SourceError
from shared.audit.export import occurred_at
from shared.audit.header import CHAINED
from shared.audit.integrity import chain_lines, check
from shared.audit.logfile import LogFile, StoreLog, write_log


@dataclass(frozen=True)
class Archived:
    """What an archive holds and what the prune removed."""

    path: Path
    envelopes: int
    through: dict[int, int]
    """Per partition, the last offset archived (the checkpoint the cut falls on)."""
    pruned: int = 0


def cut_points(source: StoreLog, until: float, signed: list[dict[str, Any]]) -> dict[int, int]:
    """Per partition, the offset of the last checkpoint before the first envelope after ``until``."""
    later: dict[int, int] = {}
    ends: dict[int, int] = {}
    for raw, p, o, _ in source.chain():
        ends[p] = o
        if p not in later and occurred_at(raw) > until:
            later[p] = o
    cuts: dict[int, int] = {}
    for p, end in ends.items():
        limit = later.get(p, end + 1)
        offsets = [r["offset"] for r in signed if r.get("kind") == "checkpoint" and r["partition"] == p
                   and r["offset"] < limit]
        if offsets:
            cuts[p] = max(offsets)
    return cuts


def archive(source: StoreLog, until: float, out: Path, *, prune: bool = False,
            tick: Callable[[], None] | None = None) -> Archived:
    """Write the archive of everything before ``until`` that a checkpoint covers; verify it; prune."""
    from shared.history import StoreError
    from shared.history.query import prune as prune_store

    signed = source.signed()
    if not signed or not source.chained():
        raise CannotReproduce(f"{source.name} holds no signed chain (written before it existed, or by a projector "
                              "without a signing key): an archive could not be told from a forged one")
    starts = source.starts()
    cuts = cut_points(source, until, signed)
    cuts = {p: c for p, c in cuts.items() if c >= starts.get(p, 0)}
    if not cuts:
        raise CannotReproduce(f"no signed checkpoint covers envelopes at or before {until:g} that the store still "
                              "holds: nothing to archive (checkpoints come every --checkpoint-every envelopes and "
                              "--checkpoint-seconds)")
    kept = [r for r in signed if r.get("kind") != "checkpoint" or r["offset"] <= cuts.get(r["partition"], -1)]

    def rows() -> Iterator[tuple[bytes, int, int, str]]:
        for n, row in enumerate(source.chain(), 1):
            if row[2] <= cuts.get(row[1], -1):
                yield row
            if tick is not None and n % 4096 == 0:
                tick()

    header = source.header.model_copy(update={"muster_log": CHAINED, "before": until})
    tmp = out.with_name(out.name + ".unverified" + ("".join(out.suffixes[-1:]) if out.name.endswith(".gz") else ""))
    try:
        count = write_log(tmp, header, chain_lines(rows(), kept, starts))
        anchors = _anchors(signed, starts)
        verdict = check(LogFile(tmp), sealed=False, after=anchors)
        if any(verdict.ends.get(p, (None,))[0] != c for p, c in cuts.items()):
            raise SourceError(f"the archive written to {tmp} does not end where it should ({cuts}): not pruning")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    pruned = 0
    if prune:
        try:
            pruned = prune_store(source.url, cuts)
        except StoreError as exc:
            raise SourceError(str(exc)) from None
    return Archived(out, count, cuts, pruned)


def _anchors(signed: list[dict[str, Any]], starts: dict[int, int]) -> dict[int, tuple[int, str, str]]:
    """Where a store pruned before goes on from: its checkpoint just before each partition's start."""
    out = {}
    for record in signed:
        if record.get("kind") == "checkpoint" and record["offset"] == starts.get(record["partition"], 0) - 1:
            out[record["partition"]] = (record["offset"], record["chain"], record["signature"])
    return out
