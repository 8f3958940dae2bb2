"""pydantic's validation errors in one line, for the one-line errors every command prints.

pydantic's own text spans several lines and links its documentation; a user needs the field and the
complaint: ``queueing: Input should be 'StrictFIFO' or 'BestEffortFIFO'``.
"""

from __future__ import annotations

from pydantic import ValidationError


def first_errors(exc: ValidationError, most: int = 3, *, values: bool = False) -> str:
    """``loc: msg`` of the first ``most`` errors, joined by ``; ``. With ``values``, `` (got VALUE)``
    where the message does not quote it and it is a scalar (a whole mapping would not fit on a line)."""
    parts = []
    for err in exc.errors()[:most]:
        loc = ".".join(str(p) for p in err["loc"])
        text = f"{loc}: {err['msg']}" if loc else err["msg"]
        value = err.get("input")
        if values and isinstance(value, (str, int, float)) and len(repr(value)) <= 80:
            text += f" (got {value!r})"
        parts.append(text)
    return "; ".join(parts)
