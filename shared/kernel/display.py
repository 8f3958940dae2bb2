"""Text from manifests as a terminal or the HTML report shows it: as text, never as markup or control sequences.

Names, labels and reasons come from users' manifests. Printed raw, Rich markup in them (``[bold red]``)
would style the output, ANSI escapes would colour or move the cursor, an OSC 8 sequence would make a
clickable link and bidirectional overrides would reorder what is read. Every place that prints
something a manifest could have written passes it through ``plain`` (for Rich markup strings),
``printable`` (for plain text; in ``shared.kernel.validation``, where the cores reach it without Rich) or
``html_text`` (for the HTML report and the what-if page).
"""

from __future__ import annotations

import html

from rich.markup import escape

from shared.kernel.validation import printable

__all__ = ["html_text", "plain", "printable"]


def plain(text: object) -> str:
    """``text`` for a Rich markup string: control characters escaped (``printable``), then markup escaped."""
    return escape(printable(str(text)))


def html_text(text: object) -> str:
    """``text`` for HTML: control characters escaped (``printable``), then ``<``, ``>``, ``&`` and quotes."""
    return html.escape(printable(str(text)))
