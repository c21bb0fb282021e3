"""Secrets never reach a report: which values are secrets, and how they are blotted out.

A value counts as a secret when the environment variable that carries it is named like one
(``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN``, ``DB_PASSWORD``...), when it has the shape of a
credential whatever its name (a URL with a password, a GitHub, Slack, Stripe, PyPI... token, a
JWT, a private key: detect-secrets' detectors), or when a variable named like a key (``*_KEY``,
``*_PAT``, ``*_DSN``, ``*WEBHOOK*``) holds a high-entropy value. A trainer that prints a secret
must not leak it through the harness's artifacts, and a leak is rarely the whole secret verbatim:
an error message prints its second half, a debug line its base64 (HTTP basic auth), a URL its
percent-encoding. So every 8-character window of a secret is a leak, and so is every window of
its hex, base64 and URL-encoded forms of the same 8 characters; a run of overlapping windows is
blotted as a whole. Text of a credential's shape is blotted too, wherever it came from.

The matching runs in linear time over any amount of text, whatever the job wrote: every window
of every secret is one RE2 automaton, the shapes another (RE2 has no backtracking), and files are
streamed in chunks, so a 16 GiB log is scanned whole at hundreds of MB/s. Files are redacted by
writing a new file beside the old one and renaming it into place: a kept log hard-linked to a
file outside the run (the project's ``.env``) is replaced by its redacted copy, never written
through.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

import re2

from .safefs import Folder, UnsafeFile, open_regular, regular_files

PLACE_NAME = re.compile(r"_(?:PATH|FILE|DIR|FOLDER)$", re.I)  # where a secret is kept, not the secret
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|API_KEY|PRIVATE_KEY|AUTH", re.I)
KEY_NAME = re.compile(r"(?:^|_)(?:KEY|PAT|DSN)$|WEBHOOK|SIGNING", re.I)  # a secret when its value looks random
REDACTED = "[REDACTED]"
WINDOW = 8  # characters of a secret that count as a leak: enough to narrow a search, and to prove the source
MIN_SECRET_CHARS = 6  # shorter values ("1", "true") would blot out half the report
B64_WINDOW = 10  # 8 bytes always show as at least 10 base64 characters fixed by those bytes alone
MIN_RANDOM_CHARS = 16  # a *_KEY value shorter than this is a name ("model-v1-abc"), not a key
RANDOM_ENTROPY = 0.8  # Shannon entropy, as a fraction of the most its length allows, of a random key
# a URL's query parameter that carries a credential whatever the host (?token=, &sig=, &X-Amz-Signature=)
URL_SECRET_PARAM = re.compile(r"token|key|sig|secret|password|passwd|auth|credential|code", re.I)
HEX = re.compile(r"[0-9a-fA-F]+")
HEX_ENTROPY = 3.0  # detect-secrets' limit for hex strings
MAX_VOWELS = 0.25  # of the letters: random base62 has about 16 %, words about 40 %
CHUNK = 8 << 20  # bytes of a file matched at a time
OVERLAP = 64 << 10  # bytes kept from one chunk to the next: a match that starts there is found whole
# detect-secrets' detectors that fire on ordinary words or numbers of a training log, left out:
NOISY_DETECTORS = {"Artifactory Credentials", "Public IP (ipv4)", "Telegram Bot Token", "Twilio API Key"}
# detectors whose pattern's first group is the secret itself (a URL's password, a quoted key):
# only that is blotted; elsewhere groups are structure (``(ghp|gho)_...``) and the match is the secret
SECRET_IN_GROUP = {
    "Basic Auth Credentials",
    "AWS Access Key",
    "Cloudant Credentials",
    "NPM tokens",
    "SoftLayer Credentials",
}


def _options() -> Any:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1  # bytes as they are: any file, text or not
    options.log_errors = False
    options.max_mem = 256 << 20
    return options


@functools.cache
def _shapes() -> tuple[Any, list[int]] | None:
    """detect-secrets' credential shapes as one RE2 automaton, and for each alternative the group
    that holds the secret itself (a URL's password, not the URL). Patterns RE2 cannot run in
    linear time (look-arounds) are left out; a trailing ``(?!\\w)`` is dropped (a longer match),
    and a lazy tail made greedy (a JWT's signature is part of it)."""
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    except ImportError:  # pragma: no cover - a core dependency
        return None
    alternatives: list[bytes] = []
    inner: list[int] = []
    group = 0
    for kind, plugin in sorted(get_mapping_from_secret_type_to_class().items()):
        if kind in NOISY_DETECTORS:
            continue
        for pattern in getattr(plugin, "denylist", ()) or ():
            text = pattern.pattern.replace("(?!\\w)", "")
            text = (text[:-1] if text.endswith("*?") else text).encode()  # a lazy tail would stop at once
            try:
                compiled = re2.compile(text, _options())
            except re2.error:
                continue
            alternatives.append(b"(" + text + b")")
            inner.append(group + 2 if compiled.groups and kind in SECRET_IN_GROUP else group + 1)
            group += 1 + compiled.groups
    if not alternatives:  # pragma: no cover
        return None
    return re2.compile(b"|".join(alternatives), _options()), inner


def shape_spans(data: bytes, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """Spans of ``data`` holding a credential by its shape (the secret part of each match)."""
    shapes = _shapes()
    if shapes is None:
        return
    regex, inner = shapes
    limit = len(data) if stop is None else stop
    for match in regex.finditer(data, start):
        if match.start() >= limit:
            return
        for index in inner:
            span = match.span(index)
            if span[0] >= 0:
                yield span
                break
        else:  # the alternative's own group: which one matched
            yield match.span()


def _entropy(value: str) -> float:
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def _random_looking(value: str) -> bool:
    """A generated key, not a name: hex of detect-secrets' entropy (3 bits a character), or mixed
    characters of high entropy for their length and few vowels (``model-v1-checkpoint`` is words)."""
    if len(value) < MIN_RANDOM_CHARS:
        return False
    if HEX.fullmatch(value):
        return _entropy(value) >= HEX_ENTROPY
    letters = [c for c in value.lower() if c.isalpha()]
    vowels = sum(c in "aeiou" for c in letters) / max(len(letters), 1)
    high = _entropy(value) >= RANDOM_ENTROPY * math.log2(min(len(value), 64))
    return _kinds(value) >= 2 and vowels <= MAX_VOWELS and high


def _names_a_place(name: str, value: str) -> bool:
    """``RAY_AUTH_TOKEN_PATH=/tmp/spotchaos-0/.../auth_token``: a variable named for where a secret
    is kept holds a path, not the secret; taken for one, every 8-character window of the path
    (``spotchaos``, the run folder) was redacted from every message."""
    return bool(PLACE_NAME.search(name)) and value.startswith("/") and not any(c.isspace() for c in value)


def secrets_of_variable(name: str, value: str) -> list[str]:
    """The secrets a variable holds: its whole value when named like a secret or random-looking
    under a key-like name, else what its value holds of a credential's shape (a URL's password,
    its ``user:password``, a token)."""
    if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_CHARS and not _names_a_place(name, value):
        return [value]
    found = _url_secrets(value, key_named=bool(KEY_NAME.search(name))) if "://" in value else []
    data = value.encode("utf-8", "surrogateescape")
    found += [data[a:b].decode("utf-8", "replace") for a, b in shape_spans(data)]
    if not found and KEY_NAME.search(name) and _random_looking(value):
        found.append(value)
    return [f for f in dict.fromkeys(found) if len(f) >= MIN_SECRET_CHARS]


def _url_secrets(value: str, *, key_named: bool) -> list[str]:
    """What a URL holds of a credential on any host, known or not: its password, a query value
    under a credential's name (``?token=``, ``&sig=``) and, when its variable is named like a key
    (``ALERT_WEBHOOK_URL``), every path segment that looks generated (a webhook's secret is its
    path). Unnamed URLs keep their paths: a tracking URI's run id is no secret to blot."""
    try:
        url = urlsplit(value)
        params = parse_qsl(url.query, keep_blank_values=False)
    except ValueError:
        return []
    found = [url.password, f"{url.username}:{url.password}"] if url.password else []
    found += [v for k, v in params if URL_SECRET_PARAM.search(k)]
    if key_named:
        found += [url.username] if url.username and len(url.username) >= MIN_RANDOM_CHARS else []  # a DSN's key
        found += [segment for segment in url.path.split("/") if _mixed(segment)]
    return found


def _mixed(segment: str) -> bool:
    """A path segment long enough and mixed enough to be a generated token. No vowel rule here: a
    token of 24 base62 characters has more than a quarter vowels among its letters one time in
    four, and under a key's name a URL's long mixed segment is its secret."""
    return len(segment) >= MIN_RANDOM_CHARS and _kinds(segment) >= 2


def _kinds(value: str) -> int:
    """How many of lower case, upper case and digits ``value`` mixes."""
    return sum(any(test(c) for c in value) for test in (str.islower, str.isupper, str.isdigit))


def secret_variables(env: Mapping[str, str]) -> dict[str, list[str]]:
    """The variables of ``env`` that hold a secret, with the secrets each holds."""
    return {k: found for k, v in env.items() if (found := secrets_of_variable(k, v))}


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The secrets of ``env``'s variables, longest first (so no secret is half-replaced)."""
    found = {s for values in secret_variables(env).values() for s in values}
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
    """Finds and blots every leaked window of a set of secrets, and every credential's shape, in
    text or bytes, in linear time."""

    def __init__(self, secrets: Iterable[str], *, shapes: bool = True) -> None:
        # every window of every form, as the bytes it is in UTF-8, by its length in bytes
        self.windows: dict[int, set[bytes]] = {}
        for secret in {s for s in secrets if s}:
            for form, size in leak_forms(secret):
                for i in range(len(form) - size + 1):
                    window = form[i : i + size].encode("utf-8", "surrogateescape")
                    self.windows.setdefault(len(window), set()).add(window)
        self._lengths = sorted(self.windows, reverse=True)  # longest first, for growing a run
        every = sorted({w for ws in self.windows.values() for w in ws}, key=len, reverse=True)
        self._values = re2.compile(b"|".join(re2.escape(w) for w in every), _options()) if every else None
        self.shapes = shapes

    def __bool__(self) -> bool:
        return self._values is not None or self.shapes

    @property
    def has_values(self) -> bool:
        """Whether there is any secret value to look for (shapes aside)."""
        return self._values is not None

    def _window_at(self, data: bytes, position: int) -> int:
        """The end of the longest window that starts at ``position``, or -1."""
        for length in self._lengths:
            if data[position : position + length] in self.windows[length]:
                return position + length
        return -1

    def value_spans(self, data: bytes, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int]]:
        """Merged spans of leaked windows that start in [start, stop): RE2 finds each run, and the
        run is grown over the windows that overlap its end (RE2's matches never overlap)."""
        if self._values is None:
            return
        limit = len(data) if stop is None else stop
        for match in self._values.finditer(data, start):
            begin, end = match.span()
            if begin >= limit:
                return
            position = begin + 1
            while position < end:
                end = max(end, self._window_at(data, position))
                position += 1
            yield begin, end

    def spans_bytes(self, data: bytes, start: int = 0, stop: int | None = None) -> list[tuple[int, int]]:
        """Merged [start, end) ranges of ``data`` to blot: leaked windows and credential shapes."""
        hits = list(self.value_spans(data, start, stop))
        if self.shapes:
            hits += shape_spans(data, start, stop)
        merged: list[tuple[int, int]] = []
        for begin, end in sorted(hits):
            if merged and begin <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((begin, end))
        return merged

    def leaks_in(self, data: bytes) -> bool:
        """Whether ``data`` holds a leaked window of a secret (shapes alone are blotted, not failed)."""
        return self._values is not None and self._values.search(data) is not None

    def found_in(self, text: str) -> bool:
        return self.leaks_in(text.encode("utf-8", "surrogatepass"))

    def redact_bytes(self, data: bytes, stop: int | None = None) -> tuple[bytes, int]:
        """``data[:cut]`` blotted, and ``cut``: spans that start before ``stop`` are blotted whole."""
        pieces, last = [], 0
        for begin, end in self.spans_bytes(data, 0, stop):
            pieces += [data[last:begin], REDACTED.encode()]
            last = end
        cut = max(last, len(data) if stop is None else stop)
        pieces.append(data[last:cut])
        return b"".join(pieces), cut

    def redact_text(self, text: str) -> str:
        if not self:
            return text
        data = text.encode("utf-8", "surrogatepass")
        if not self.spans_bytes(data):
            return text
        return self.redact_bytes(data)[0].decode("utf-8", "surrogatepass")

    def stream(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """The redacted content of a stream of chunks, with no match lost at a chunk's edge."""
        carry = b""
        for chunk in chunks:
            data = carry + chunk
            if len(data) <= OVERLAP:
                carry = data
                continue
            done, cut = self.redact_bytes(data, len(data) - OVERLAP)
            carry = data[cut:]
            yield done
        yield self.redact_bytes(carry)[0]


def _chunks(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, CHUNK):
        yield chunk


def file_leaks(fd: int, matcher: SecretMatcher, *, shapes: bool = False) -> bool:
    """Whether the file behind ``fd`` holds a leaked window anywhere (streamed, read whole), or
    with ``shapes`` anything to blot at all."""
    found = (lambda data: bool(matcher.spans_bytes(data))) if shapes else matcher.leaks_in
    carry = b""
    for chunk in _chunks(fd):
        data = carry + chunk
        if found(data):
            return True
        carry = data[-OVERLAP:]
    return False


def _each_file(root: Path, act: Callable[[Folder, Path], bool]) -> list[str]:
    """The relative names of the regular files under ``root`` (every one, whatever its name or
    size; no link followed) for which ``act(folder, relative)`` is true; a file that cannot be
    opened safely is passed over."""
    if not os.path.isdir(root) or os.path.islink(root):
        return []
    found = []
    with Folder.open(root) as folder:
        for path in regular_files(root):
            relative = path.relative_to(root)
            with contextlib.suppress(UnsafeFile, OSError):
                if act(folder, relative):
                    found.append(str(relative))
    return found


def artifact_leaks(path: Path, matcher: SecretMatcher) -> bool:
    """Whether one file the harness wrote (a report, the JUnit XML) holds a secret, read whole,
    never through a link; a missing or refused file holds none."""
    try:
        fd = open_regular(path)
    except (FileNotFoundError, UnsafeFile):
        return False
    try:
        return file_leaks(fd, matcher)
    finally:
        os.close(fd)


def leak_failure(root: Path, secrets: Iterable[str], environment: Mapping[str, str]) -> str | None:
    """The failure naming where a run's captured output (under ``root``) shows a secret, if it
    does: which of the job's variables (``environment``) held one, and the files."""
    found = leaking_files(root, secrets)
    if not found:
        return None
    names = sorted(secret_variables(environment))
    return (
        f"a secret ({', '.join(names) or 'a storage credential'}, or 8 characters of it, or its encoding) "
        f"appears in: {', '.join(found)}; the job must not print its credentials"
    )


def leaking_files(root: Path, secrets: Iterable[str] | SecretMatcher) -> list[str]:
    """The files under ``root`` that hold a leaked window of a secret, by name relative to it."""
    matcher = secrets if isinstance(secrets, SecretMatcher) else SecretMatcher(secrets, shapes=False)
    if not matcher.has_values:
        return []

    def leaks(folder: Folder, relative: Path) -> bool:
        fd = folder.open_file(relative)
        try:
            return file_leaks(fd, matcher)
        finally:
            os.close(fd)

    return _each_file(root, leaks)


def redact_files(root: Path, matcher: SecretMatcher) -> list[str]:
    """Blot every leak and credential in every regular file under ``root``: each file that holds
    one is replaced by a redacted copy written beside it and renamed into its place (through the
    folder's fd: a link is never followed, a hard link's other names keep their content)."""
    if not matcher:
        return []
    return _each_file(root, lambda folder, relative: _redact_file(folder, relative, matcher))


def _redact_file(folder: Folder, relative: Path, matcher: SecretMatcher) -> bool:
    fd = folder.open_file(relative)
    try:
        if not file_leaks(fd, matcher, shapes=True):
            return False
        os.lseek(fd, 0, os.SEEK_SET)
        mode = os.fstat(fd).st_mode & 0o666
        temporary = relative.with_name(f".{relative.name}.spotchaos-redacted")
        out = folder.create_file(temporary, mode)
        try:
            with os.fdopen(out, "wb") as f:
                for piece in matcher.stream(_chunks(fd)):
                    f.write(piece)
            folder.rename(temporary, relative)
        except BaseException:
            with contextlib.suppress(OSError):
                folder.unlink(temporary)
            raise
    finally:
        os.close(fd)
    return True


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
    """Names of the captured texts (messages, reports...) that hold any leaked window of
    ``secret`` (or of any of several secrets)."""
    matcher = SecretMatcher([secret] if isinstance(secret, str) else secret, shapes=False)
    if not matcher.has_values:
        return []
    return sorted(name for name, text in captured.items() if matcher.found_in(text))
