"""Text from manifests as a terminal or the HTML report shows it: as text, never as markup or control sequences.

Names, labels and reasons come from users' manifests. Printed raw, Rich markup in them (``[bold red]``)
would style the output, ANSI escapes would colour or move the cursor, an OSC 8 sequence would make a
clickable link and bidirectional overrides would reorder what is read. Every place that prints
something a manifest could have written passes it through ``plain`` (for Rich markup strings),
``printable`` (for plain text) or ``html_text`` (for the HTML report and the what-if page).
"""

from __future__ import annotations

import html
import re

from rich.markup import escape

_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline, DEL, C1 controls (ESC starts ANSI and OSC 8 sequences, CSI is C1's
0x9b), and the bidirectional marks and overrides."""


def printable(text: str) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``), so it prints as itself."""
    if text.isascii() and text.isprintable():  # the common case: names and reasons are plain ASCII
        return text
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else f"\\u{ord(m.group()):04x}", text)


def plain(text: object) -> str:
    """``text`` for a Rich markup string: control characters escaped (``printable``), then markup escaped."""
    return escape(printable(str(text)))


def html_text(text: object) -> str:
    """``text`` for HTML: control characters escaped (``printable``), then ``<``, ``>``, ``&`` and quotes."""
    return html.escape(printable(str(text)))
