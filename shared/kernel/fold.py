"""The one way muster folds an event: a table from payload type to handler, per class.

A class that folds envelopes (the four cores, the history projection, the audit fold, the
reconciler's status view) names each handler ``_on_<PayloadType>`` and takes its table from
``Folds``: ``cls.folds[env.type]`` is the function for that payload type, the most derived one
(an audit fold that overrides ``_on_Dequeued`` is called in its projection's place), aliases
included (``_on_WorkloadDeleted = _gone``). Why a name and not an ``isinstance`` chain: the
reader of a core finds what an event does by grepping one name, the runtime finds its handler with
one dict lookup, and a handler for a payload type that does not exist is refused when the class is
made, not silently never called.

The table lives on the class, not the instance: a core's state snapshot holds its books, not its
handlers. A handler is called unbound, ``handler(self, payload, ...)``; its own signature says
what it takes and returns (typed payloads, typed outputs).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from shared.kernel.events import PAYLOAD_TYPES

PREFIX = "_on_"


def handlers_of(cls: type) -> dict[str, Callable[..., Any]]:
    """``cls``'s ``_on_<PayloadType>`` functions by payload type, inherited ones and aliases included.

    Raises TypeError for an ``_on_<Name>`` whose name is a capitalised word but no payload type: a
    misspelt handler would otherwise never run. Lower-case ``_on_`` helpers are not handlers."""
    table: dict[str, Callable[..., Any]] = {}
    for name in dir(cls):
        if not name.startswith(PREFIX):
            continue
        event = name[len(PREFIX):]
        if not event[:1].isupper():
            continue
        if event not in PAYLOAD_TYPES:
            raise TypeError(f"{cls.__qualname__}.{name} handles no payload type (known: see PAYLOAD_TYPES)")
        table[event] = getattr(cls, name)
    return table


class Folds:
    """Gives a class its table, ``folds`` (payload type -> unbound handler), made once per class."""

    folds: ClassVar[dict[str, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.folds = handlers_of(cls)
