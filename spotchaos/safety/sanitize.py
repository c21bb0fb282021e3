"""Trainer text shown to people: made inert before it reaches a terminal or a Markdown page.

Failure messages quote the job's own output (the tail of its stderr, a line it printed). That
text is the job's, and the job is untrusted: raw ESC bytes would drive the CI log's terminal
(hide lines, fake a green summary), bidirectional controls (U+202E and friends, "Trojan Source")
would show a line in an order other than its bytes', zero-width characters would hide text or
make two names look alike, and Markdown markup would become links and images on the CI's summary
page. So control, bidi and zero-width characters are shown as escapes, and Markdown's markup
characters and bare URLs are escaped where such text reaches ``report.md``.
"""

from __future__ import annotations

import re

# C0 (tab and newline kept), DEL, C1; bidi embeddings, overrides, isolates and marks; zero-width
# spaces and joiners, the word joiner, invisible operators, the BOM; line and paragraph separators
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")
# links, images and reference definitions all need "["; emphasis and strike-through "*", "_", "~"
MARKDOWN_MARKUP = re.compile(r"([\\`\[\]|*_~])")
AUTOLINK = re.compile(r"(?i)(://|www\.)")


def visible(text: str) -> str:
    """``text`` with every control, bidi and zero-width character but tab and newline written as
    ``\\xNN`` (``\\u202e`` above 0xff)."""
    return CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def markdown_text(text: str) -> str:
    """``text`` as inert Markdown: markup escaped, bare URLs broken, controls made visible."""
    escaped = MARKDOWN_MARKUP.sub(r"\\\1", visible(text)).replace("<", "&lt;").replace(">", "&gt;")
    return AUTOLINK.sub(lambda m: ":&#47;/" if m.group() == "://" else m.group()[:3] + "&#46;", escaped)
