"""Trainer text shown to people: made inert before it reaches a terminal or a Markdown page.

Failure messages quote the job's own output (the tail of its stderr, a line it printed). That
text is the job's, and the job is untrusted: raw ESC bytes would drive the CI log's terminal
(hide lines, fake a green summary), and Markdown markup would become links and images on the
CI's summary page. So control characters are shown as escapes, and Markdown's markup characters
and bare URLs are escaped where such text reaches ``report.md``.
"""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 (tab and newline kept), DEL, C1
MARKDOWN_MARKUP = re.compile(r"([\\`\[\]|])")  # links, images and reference definitions all need "["
AUTOLINK = re.compile(r"(?i)(://|www\.)")


def visible(text: str) -> str:
    """``text`` with every control character but tab and newline written as ``\\xNN``."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def markdown_text(text: str) -> str:
    """``text`` as inert Markdown: markup escaped, bare URLs broken, controls made visible."""
    escaped = MARKDOWN_MARKUP.sub(r"\\\1", visible(text)).replace("<", "&lt;").replace(">", "&gt;")
    return AUTOLINK.sub(lambda m: ":&#47;/" if m.group() == "://" else m.group()[:3] + "&#46;", escaped)
