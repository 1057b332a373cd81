"""Text from tools and models shown on a terminal: control characters made visible.

A tool's output (or a model's text) is untrusted: written raw to a terminal, `\\x1b[...` sequences
recolour or clear the screen, move the cursor over earlier lines, set the window title or (OSC 52)
the clipboard, and `\\r` overwrites what was printed. `visible` replaces every control character
except newline and tab — C0, DEL, the C1 range (`\\x9b` is a one-byte CSI) — and the Unicode
bidirectional overrides (which reorder what is displayed) with escapes a reader can see: `\\x1b`,
`\\r`, `\\u202e`. Commands apply it when they write to a terminal; `--json` output is never changed.
"""

from __future__ import annotations

import re

_NAMED = {"\r": "\\r"}
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = m.group(0)
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def visible(text: str) -> str:
    """`text` with its control characters (all but newline and tab) and bidi overrides written as
    escapes (`\\x1b`, `\\r`, `\\u202e`); a backslash stays as it is."""
    return _CONTROL.sub(_escape, text)


def for_stream(text: str, stream) -> str:
    """`visible(text)` when `stream` is a terminal, else `text` unchanged (a pipe or file gets the bytes)."""
    isatty = getattr(stream, "isatty", None)
    return visible(text) if isatty is not None and isatty() else text
