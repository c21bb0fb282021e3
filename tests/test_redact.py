"""Secrets and every leaked start of one are blotted out of anything the report holds."""

from __future__ import annotations

import pytest

from spotchaos.safety.redact import REDACTED, redact, secret_values

pytestmark = pytest.mark.unit  # starts no process: part of the fast loop (pytest -m unit)

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


def test_secret_named_variables_are_found_and_others_are_not():
    env = {"AWS_SECRET_ACCESS_KEY": SECRET, "HF_TOKEN": "hf_abcdefgh", "PATH": "/usr/bin", "DB_PASSWORD": "1"}
    assert secret_values(env) == [SECRET, "hf_abcdefgh"]  # longest first; "1" is too short to redact
    # a variable naming where a secret is kept holds a path: no secret (its windows would redact the run folder)
    assert secret_values({"RAY_AUTH_TOKEN_PATH": "/tmp/spotchaos-0/ray-ab12cd/auth_token"}) == []
    assert secret_values({"HF_TOKEN_FILE": "hf_abcdefghij"}) == ["hf_abcdefghij"]  # no path: still a secret


def test_a_urls_credentials_are_secrets_on_any_host_and_a_plain_urls_path_is_not():
    webhook = "https://alerts.example.internal/hooks/T0ABC1234/q9W8e7R6t5Y4u3I2o1P0aSdF"
    signed = "https://blobs.example.net/ckpt/model.pt?sv=2024-05-04&sig=Zk3Lq9Xw2Vb7Nm4Rt8Yp1Hc6Jd0Gs5Fa"
    tracking = "http://127.0.0.1:5000/#/experiments/3/runs/9f2c4b7e1a6d48f0b3c5e7a9d1f2b4c6"
    env = {"ALERT_WEBHOOK_URL": webhook, "CKPT_URL": signed, "MLFLOW_TRACKING_URI": tracking}
    assert secret_values(env) == ["Zk3Lq9Xw2Vb7Nm4Rt8Yp1Hc6Jd0Gs5Fa", "q9W8e7R6t5Y4u3I2o1P0aSdF"]
    leaked = f"POST {webhook} failed; GET {signed}; tracking at {tracking}"
    clean = redact(leaked, secret_values(env))
    assert "q9W8e7R6" not in clean and "Zk3Lq9Xw" not in clean and "/hooks/T0ABC1234/" in clean
    assert tracking in clean  # a run id in a URL of no key's name is left as it is


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
