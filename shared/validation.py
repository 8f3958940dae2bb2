"""pydantic's validation errors in one line, for the one-line errors every command prints.

pydantic's own text spans several lines and links its documentation; a user needs the field and the
complaint: ``queueing: Input should be 'StrictFIFO' or 'BestEffortFIFO'``.
"""

from __future__ import annotations

from pydantic import ValidationError


def first_errors(exc: ValidationError, most: int = 3) -> str:
    """``loc: msg`` of the first ``most`` errors, joined by ``; ``."""
    parts = []
    for err in exc.errors()[:most]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)
