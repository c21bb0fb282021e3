"""Secrets and every leaked start of one are blotted out of anything the report holds."""

from __future__ import annotations

import pytest

from spotchaos.safety.redact import REDACTED, redact, secret_values

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


def test_secret_named_variables_are_found_and_others_are_not():
    env = {"AWS_SECRET_ACCESS_KEY": SECRET, "HF_TOKEN": "hf_abcdefgh", "PATH": "/usr/bin", "DB_PASSWORD": "1"}
    assert secret_values(env) == [SECRET, "hf_abcdefgh"]  # longest first; "1" is too short to redact


def test_full_secret_prefix_and_longer_prefix_are_redacted_in_nested_values():
    document = {
        "error": f"denied for {SECRET}.",
        "runs": [{"stderr": f"key={SECRET[:8]} and key={SECRET[:12]}!"}],
        SECRET[:9]: ("tuple", SECRET),
        "count": 3,
    }
    clean = redact(document, [SECRET])
    assert clean == {
        "error": f"denied for {REDACTED}.",
        "runs": [{"stderr": f"key={REDACTED} and key={REDACTED}!"}],
        REDACTED: ["tuple", REDACTED],
        "count": 3,
    }


def test_seven_characters_are_not_a_leak_and_no_secrets_change_nothing():
    text = f"id {SECRET[:7]}"
    assert redact(text, [SECRET]) == text
    assert redact({"a": SECRET}, []) == {"a": SECRET}
