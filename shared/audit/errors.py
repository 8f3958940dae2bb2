"""What can be wrong with a log handed to the audit commands, each with its exit code.

The command line prints the message as one line and exits with the code, so a script can tell a
log that was cut short from one that was tampered with from one this muster cannot read:

    0  everything checked out
    1  ``replay --verify``: a decision differs from the one recorded; ``explain``: no such workload
    2  the log cannot be reproduced by this muster: its schema version or layout is newer or
       below the first, its policy is missing or not one this muster reads, it is a window of a
       history rather than all of it; also bad command-line use (a bad flag value, a bad URL, an
       unreachable store or broker), as in every command, and a ``--what-if --apply`` manifest
       that admission (or the API server) refuses
    3  the log is truncated: a cut-off last line, a compressed stream that ends early, no end line
    4  a line that is not an envelope (or not a muster log at all), named by its line number
    5  the store holds another run's history (a store holds one)
    6  a Kafka log whose services' inboxes cannot be put in one order (export cannot write it)
    7  ``replay --verify``: the log is not the one its signer wrote: its hash chain breaks, a signature
       or checkpoint does not hold, it disagrees with a witness (``shared.audit.integrity``)
"""

from __future__ import annotations

OK, DIVERGED, CANNOT_REPRODUCE, TRUNCATED, NOT_AN_ENVELOPE, OTHER_HISTORY, UNORDERED = 0, 1, 2, 3, 4, 5, 6


class AuditError(Exception):
    """A log that cannot be used as given; ``exit_code`` says which kind of trouble."""

    exit_code = CANNOT_REPRODUCE


class CannotReproduce(AuditError):
    """A newer schema, an unknown or unreadable policy, a window of a history."""

    exit_code = CANNOT_REPRODUCE


class TruncatedLog(AuditError):
    exit_code = TRUNCATED


class NotAnEnvelope(AuditError):
    exit_code = NOT_AN_ENVELOPE


class OtherRun(AuditError):
    exit_code = OTHER_HISTORY


class Unordered(AuditError):
    exit_code = UNORDERED


class ApplyRefused(AuditError):
    """An ``--apply`` manifest admission refuses (or the API server would): the what-if would run without
    it, quietly, and compare a history the user did not ask about."""

    exit_code = CANNOT_REPRODUCE


class SourceError(AuditError):
    """The log's place cannot be read: a missing file, a bad URL, a store or broker that does not answer."""

    exit_code = CANNOT_REPRODUCE
