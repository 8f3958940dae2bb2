"""``muster log key|keygen|checkpoints``: the signing key of the event log and its signed checkpoints.

The log's signer (the projector; a simulated run signs with a key made for it) signs checkpoints of the
hash chain (``shared.history.integrity``). An auditor checks them with the public key (``log key``,
published wherever the auditor trusts) and a witness keeps them elsewhere (``log checkpoints``), so
that ``replay --verify --witness`` can tell a history rewritten even with the key stolen.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import typer

from shared.cli.errors import failed
from shared.cli.options import STORE_HELP

KEY_FILE_HELP = ("The signing key file (PEM, PKCS#8 Ed25519; a Kubernetes Secret mounted as a file). Default: "
                 "$MUSTER_SIGNING_KEY.")


def _signed(store: Optional[str], log: Optional[Path], kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The signed records of a store or a chained log file."""
    from shared.history import StoreError
    from shared.history.engine import resolve_url
    from shared.history.query import read_signed

    if log is not None:
        from shared.audit.errors import AuditError
        from shared.audit.integrity import parse_signed
        from shared.audit.logfile import SIGNED_KEY, LogFile

        try:
            source = LogFile(log)
            records = [parse_signed(line, f"{log}: line {n}") for n, line in source.raw_lines()
                       if line.startswith(SIGNED_KEY)]
        except AuditError as exc:
            raise failed(str(exc)) from None
        return [r for r in records if r.get("kind") in kinds]
    try:
        return read_signed(resolve_url(store), kinds)
    except StoreError as exc:
        raise failed(exc) from None


def log_key(
    key_file: Optional[Path] = typer.Option(None, "--key-file", help=KEY_FILE_HELP),
    store: Optional[str] = typer.Option(None, "--store", help="Instead: the keys this store's log was signed with. "
                                        + STORE_HELP),
    log: Optional[Path] = typer.Option(None, "--log", help="Instead: the keys a chained log file names."),
) -> None:
    """Print the public key that signs the event log (PEM), to publish where an auditor trusts it."""
    from shared.history.integrity import KEY_ENV, BadKey, Signer, public_from_b64, public_pem

    path = key_file or (Path(os.environ[KEY_ENV]) if os.environ.get(KEY_ENV) else None)
    if path is not None and store is None and log is None:
        try:
            signer = Signer.from_file(path)
        except BadKey as exc:
            raise failed(str(exc)) from None
        typer.echo(public_pem(signer.public), nl=False)
        typer.echo(f"key {signer.id}", err=True)
        return
    if store is None and log is None and not os.environ.get("MUSTER_STORE"):
        raise failed("say whose key: --key-file FILE (or $MUSTER_SIGNING_KEY), --store URL or --log FILE")
    keys = _signed(store, log, ("key",))
    if not keys:
        raise failed("the log has no signing key: it was written before the chain existed, or by a projector "
                     "without --signing-key")
    for record in keys:
        rotated = f", rotated from {record['previous']}" if record.get("previous") else ""
        typer.echo(f"key {record['key_id']} (introduced {record.get('time')}{rotated})", err=True)
        typer.echo(public_pem(public_from_b64(record["public_key"])), nl=False)


def log_keygen(
    out: Path = typer.Option(..., "--out", help="Where to write the new private key (PEM, mode 0600)."),
) -> None:
    """Make a new Ed25519 signing key; print its public key (PEM). Store the file as a Kubernetes Secret."""
    from shared.history.integrity import Signer, public_pem

    if out.exists():
        raise failed(f"{out} exists: a signing key is never overwritten (rotate to a new file)")
    signer = Signer.generate()
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(signer.pem())
    except OSError as exc:
        raise failed(f"cannot write {out}: {exc.strerror or exc}") from None
    typer.echo(public_pem(signer.public), nl=False)
    typer.echo(f"key {signer.id} written to {out}", err=True)


def _time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise failed(f"--since {text}: not an ISO 8601 time (2026-12-07T10:00:00Z) or epoch seconds") from None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def log_checkpoints(
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    log: Optional[Path] = typer.Option(None, "--log", help="Instead: the checkpoints of a chained log file."),
    since: Optional[str] = typer.Option(None, "--since", help="Only checkpoints signed at or after this wall-clock "
                                        "time (ISO 8601, or epoch seconds)."),
) -> None:
    """Print the signed checkpoints (and the keys) as JSON lines, for a witness to store elsewhere; `muster replay
    LOG --verify --witness FILE` then fails when the log disagrees with any of them."""
    bound = _time(since) if since is not None else None
    for record in _signed(store, log, ("key", "checkpoint")):
        if bound is not None and record.get("kind") == "checkpoint" and _time(str(record.get("time"))) < bound:
            continue
        typer.echo(json.dumps({"muster_signed": record}, separators=(",", ":"), ensure_ascii=False))
