"""Secrets never reach a report: which values are secrets, and how they are blotted out.

A value counts as a secret when the environment variable that carries it is named like one
(``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN``, ``DB_PASSWORD``...). A trainer that prints a secret
must not leak it through the harness's artifacts, and a leak is rarely the whole secret verbatim:
an error message prints its second half, a debug line its base64 (HTTP basic auth), a URL its
percent-encoding. So every 8-character window of a secret is a leak, and so is every window of
its hex, base64 and URL-encoded forms of the same 8 characters; a run of overlapping windows is
blotted as a whole.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|API_KEY|PRIVATE_KEY|AUTH", re.I)
REDACTED = "[REDACTED]"
WINDOW = 8  # characters of a secret that count as a leak: enough to narrow a search, and to prove the source
MIN_SECRET_CHARS = 6  # shorter values ("1", "true") would blot out half the report
B64_WINDOW = 10  # 8 bytes always show as at least 10 base64 characters fixed by those bytes alone


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of variables named like secrets, longest first (so no secret is half-replaced)."""
    found = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(found, key=len, reverse=True)


def _base64_cores(raw: bytes) -> Iterator[str]:
    """The base64 characters fixed by ``raw`` alone, at each of the three byte alignments it can
    have inside a longer encoded message, in the standard and the URL-safe alphabet."""
    for shift in range(3):
        padded = b"\0" * shift + raw
        start = -(-shift * 8 // 6)  # characters that also hold bits of the bytes before
        end = len(padded) // 3 * 4  # the last partial group also holds bits of the bytes after
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            core = encode(padded).decode()[start:end]
            if len(core) >= B64_WINDOW:
                yield core


def leak_forms(secret: str) -> Iterator[tuple[str, int]]:
    """(form, window size) for the secret and each encoding of it that a leak may take."""
    raw = secret.encode()
    window = min(WINDOW, len(secret))
    yield secret, window
    yield raw.hex(), 2 * min(WINDOW, len(raw))
    yield raw.hex().upper(), 2 * min(WINDOW, len(raw))
    for core in _base64_cores(raw):
        yield core, B64_WINDOW
    for quoted in {quote(secret, safe=""), quote_plus(secret)} - {secret}:
        yield quoted, window


class SecretMatcher:
    """Finds and blots every leaked window of a set of secrets in text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.windows: dict[int, set[str]] = {}
        for secret in {s for s in secrets if s}:
            for form, size in leak_forms(secret):
                found = self.windows.setdefault(size, set())
                found.update(form[i : i + size] for i in range(len(form) - size + 1))

    def __bool__(self) -> bool:
        return bool(self.windows)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Merged [start, end) ranges of ``text`` covered by a leaked window."""
        hits = sorted(
            (i, i + size)
            for size, windows in self.windows.items()
            for i in range(len(text) - size + 1)
            if text[i : i + size] in windows
        )
        merged: list[tuple[int, int]] = []
        for start, end in hits:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def found_in(self, text: str) -> bool:
        return any(
            text[i : i + size] in windows for size, windows in self.windows.items() for i in range(len(text) - size + 1)
        )

    def redact_text(self, text: str) -> str:
        pieces, last = [], 0
        for start, end in self.spans(text):
            pieces += [text[last:start], REDACTED]
            last = end
        return "".join(pieces) + text[last:] if pieces else text


def redact(value: Any, secrets: Iterable[str] | SecretMatcher) -> Any:
    """``value`` with every leaked window of a secret replaced; recursive over dicts and lists."""
    matcher = secrets if isinstance(secrets, SecretMatcher) else SecretMatcher(secrets)
    if not matcher:
        return value

    def scrub(item: Any) -> Any:
        if isinstance(item, str):
            return matcher.redact_text(item)
        if isinstance(item, Mapping):
            return {scrub(k): scrub(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [scrub(v) for v in item]
        return item

    return scrub(value)


def find_leaks(captured: Mapping[str, str], secret: str | Iterable[str]) -> list[str]:
    """Names of the captured texts (stdout, stderr, events, reports...) that hold any leaked
    window of ``secret`` (or of any of several secrets)."""
    matcher = SecretMatcher([secret] if isinstance(secret, str) else secret)
    if not matcher:
        return []
    return sorted(name for name, text in captured.items() if matcher.found_in(text))
