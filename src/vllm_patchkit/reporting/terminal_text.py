"""Untrusted text made safe to show people: no terminal control, no markup.

Why: a record's reason, a remedy, an exception's text or a third party's wrapper name is data. Printed raw, an
ESC sequence clears the screen or rewrites a line as "OK"; given to rich as markup, `[/opt/x/libfoo.so]` raises
MarkupError and the whole table is lost. Every human rendering passes such text through `printable` (and rich
gets it as `Text`, never as markup); `--json` keeps it verbatim.
"""

from __future__ import annotations

import re

# An ESC sequence (CSI, OSC/DCS/APC/PM strings, two-byte escapes), the 8-bit CSI, or one control character:
# C0 but newline and tab, DEL, C1, and the Unicode controls that reorder or break lines (bidi overrides,
# isolates, U+2028/U+2029), which make a line read differently than it is.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)


def _shown(m: re.Match) -> str:
    return m.group().encode("unicode_escape").decode("ascii")


def printable(text: object, newlines: bool = True) -> str:
    """`text` as a str with every control character and escape sequence replaced by its visible escape
    (`\\x1b[2J`, `\\r`, `\\x9b`): nothing reaches the terminal as control, and the reader still sees what was
    there. `newlines=False`: a newline is shown as `\\n` too (a one-line cell)."""
    s = text if isinstance(text, str) else str(text)
    s = _CONTROL.sub(_shown, s)
    return s.replace("\n", "\\n") if not newlines else s


def rich_text(text: object, newlines: bool = True):
    """`printable(text)` as a rich `Text`: rendered as it reads, never parsed as markup or emoji codes."""
    from rich.text import Text

    return Text(printable(text, newlines))
