"""`printable`: the one sanitizer for text that came from an input and is about to reach a terminal.

Every command line of this distribution (`bide`, `bide-audit`, `govern`) passes each string it prints from
a store, an artifact or a certificate through `printable` first. Text from a file is attacker-controlled:
an escape sequence in a record key or an event name could otherwise move the cursor, erase "NOT VERIFIED"
and print a fake success line, and a right-to-left override or a line separator could disguise what is
shown. Such characters are written as visible escapes instead (``\\x1b``, ``\\u202e``), so the output says
what the input holds and nothing can act on the terminal.
"""

from __future__ import annotations

__all__ = ["printable"]


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every character Python does not call printable (C0 and C1 controls, DEL, escape,
    format characters such as bidirectional overrides, line and paragraph separators, unassigned code
    points) replaced by a visible escape. Line feeds are kept only with `keep_newlines` (for multi-line
    text the program itself wrote); a line feed from an input is escaped, so it cannot start a fake line."""
    if text.isprintable():
        return text
    if keep_newlines:
        return "\n".join(printable(line) for line in text.split("\n"))
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
