"""Secrets never reach a report: which values are secrets, and how they are blotted out.

A value counts as a secret when the environment variable that carries it is named like one
(``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN``, ``DB_PASSWORD``...). A trainer that prints a secret
(or the start of one) in an error message must not leak it through the harness's report.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|API_KEY|PRIVATE_KEY|AUTH", re.I)
REDACTED = "[REDACTED]"
PREFIX_CHARS = 8  # a leaked prefix is a leak too: it narrows a brute-force search, and proves the source
MIN_SECRET_CHARS = 6  # shorter values ("1", "true") would blot out half the report


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of variables named like secrets, longest first (so no secret is half-replaced)."""
    found = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(found, key=len, reverse=True)


def _leak_pattern(secret: str) -> str:
    """The secret's first 8 characters, then as much of the rest as follows in order.

    So ``token=abcdefgh123`` loses ``abcdefgh123``, not only ``abcdefgh``: every leaked character
    of a secret is blotted, and the full secret is the longest match.
    """
    head, rest = secret[:PREFIX_CHARS], secret[PREFIX_CHARS:]
    tail = ""
    for char in reversed(rest):
        tail = f"(?:{re.escape(char)}{tail})?"
    return re.escape(head) + tail


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` with every secret, and every leaked start of one (8+ characters), replaced; recursive."""
    patterns = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not patterns:
        return value
    needle = re.compile("|".join(_leak_pattern(s) for s in patterns))

    def scrub(item: Any) -> Any:
        if isinstance(item, str):
            return needle.sub(REDACTED, item)
        if isinstance(item, Mapping):
            return {scrub(k): scrub(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [scrub(v) for v in item]
        return item

    return scrub(value)


def find_leaks(captured: Mapping[str, str], secret: str) -> list[str]:
    """Names of the captured texts (stdout, stderr, events, reports...) that hold ``secret`` or its
    first 8 characters: a scan for the unique secret the harness handed a run."""
    needles = {secret, secret[:PREFIX_CHARS]} if len(secret) > PREFIX_CHARS else {secret}
    return sorted(name for name, text in captured.items() if any(n in text for n in needles))
