"""The S3 service and its fault layer, driven with boto3 over HTTP on loopback (real moto)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from spotchaos.errors import BackendError
from spotchaos.probe import ENV_CHECKPOINT_URI
from spotchaos.storage import (
    Bandwidth,
    Credentials,
    ExpiredToken,
    FaultProxy,
    Hang,
    InternalError,
    Latency,
    MotoS3,
    ReadOnly,
    ResetMidUpload,
    SlowDown,
)

from .helpers import FIXTURES

BUCKET = "checkpoints"
pytest_plugins = ["pytester"]


@pytest.fixture
def moto(spotchaos_moto):
    """The plugin's session-wide moto server (what scenarios get), reset for each test."""
    spotchaos_moto.reset()
    return spotchaos_moto


@pytest.fixture
def proxy(moto):
    with FaultProxy(moto.endpoint) as fault_proxy:
        client(fault_proxy).create_bucket(Bucket=BUCKET)
        yield fault_proxy


def client(proxy: FaultProxy, *, key: str = "AKIAEXAMPLEWRITER", attempts: int = 1, timeout: float = 5):
    return boto3.client(
        "s3",
        endpoint_url=proxy.endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key="not-a-real-secret",
        config=Config(
            retries={"mode": "standard", "total_max_attempts": attempts}, read_timeout=timeout, connect_timeout=2
        ),
    )


def keys(proxy: FaultProxy) -> list[str]:
    return [o["Key"] for o in client(proxy).list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def test_objects_pass_through_unchanged(proxy):
    data = os.urandom(3 * 2**20 + 7)
    s3 = client(proxy)
    s3.put_object(Bucket=BUCKET, Key="ckpt/model.pt", Body=data)
    assert s3.get_object(Bucket=BUCKET, Key="ckpt/model.pt")["Body"].read() == data
    assert proxy.requests >= 3 and proxy.injected == {}


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        (SlowDown(probability=1.0), "SlowDown", 503),
        (InternalError(probability=1.0), "InternalError", 500),
        (ExpiredToken(), "ExpiredToken", 400),
        (ReadOnly(), "AccessDenied", 403),
    ],
)
def test_faults_answer_with_s3_errors_and_store_nothing(proxy, fault, code, status):
    proxy.add(fault)
    with pytest.raises(ClientError) as raised:
        client(proxy).put_object(Bucket=BUCKET, Key="ckpt/model.pt", Body=b"weights")
    error = raised.value.response
    assert error["Error"]["Code"] == code and error["ResponseMetadata"]["HTTPStatusCode"] == status
    fault.enabled = False  # the switch: S3 answers again, and the refused object was never stored
    assert keys(proxy) == []
    assert proxy.injected == {fault.name: 1}


def test_slow_down_storm_is_survived_by_standard_retries(proxy):
    proxy.add(SlowDown(probability=0.5, seed=3))
    for index in range(5):
        client(proxy, attempts=10).put_object(Bucket=BUCKET, Key=f"k{index}", Body=b"x")
    proxy.clear()
    assert len(keys(proxy)) == 5 and proxy.injected["slow-down"] >= 1


def test_read_only_credentials_may_read_but_not_write(proxy):
    client(proxy).put_object(Bucket=BUCKET, Key="old", Body=b"kept")
    proxy.add(ReadOnly(access_key="AKIAEXAMPLEREADER"))
    reader = client(proxy, key="AKIAEXAMPLEREADER")
    assert reader.get_object(Bucket=BUCKET, Key="old")["Body"].read() == b"kept"
    for write in (
        lambda: reader.put_object(Bucket=BUCKET, Key="new", Body=b"x"),
        lambda: reader.delete_object(Bucket=BUCKET, Key="old"),
    ):
        with pytest.raises(ClientError, match="AccessDenied"):
            write()
    client(proxy).put_object(Bucket=BUCKET, Key="writer", Body=b"y")  # other keys still write
    assert sorted(keys(proxy)) == ["old", "writer"]


def test_expired_token_starts_mid_run(proxy):
    s3 = client(proxy)
    proxy.add(ExpiredToken(after_seconds=0.6))
    time.sleep(0.7)  # a job's start-up before its first request does not count
    s3.put_object(Bucket=BUCKET, Key="before", Body=b"x")
    time.sleep(0.7)
    with pytest.raises(ClientError, match="ExpiredToken"):
        s3.put_object(Bucket=BUCKET, Key="after", Body=b"x")


def test_reset_mid_upload_never_lands_a_torn_object(proxy):
    proxy.add(ResetMidUpload(after_bytes=256 * 1024))
    with pytest.raises(ConnectionClosedError):
        client(proxy).put_object(Bucket=BUCKET, Key="torn", Body=os.urandom(2 * 2**20))
    proxy.clear()
    assert keys(proxy) == []


def test_hang_outlasts_the_client_timeout_and_stop_releases_it(moto):
    proxy = FaultProxy(moto.endpoint).start()
    try:
        proxy.add(Hang(seconds=120, methods=frozenset({"PUT"})))
        started = time.monotonic()
        with pytest.raises(ReadTimeoutError):
            client(proxy, timeout=1).put_object(Bucket=BUCKET, Key="k", Body=b"x")
        assert time.monotonic() - started < 30
    finally:
        before = threading.active_count()
        proxy.stop()  # must not wait for the held request's 120 s
    assert threading.active_count() <= before


def test_bandwidth_cap_slows_uploads_at_least_to_the_cap(proxy):
    """A lower bound only (a cap may never be exceeded); its accuracy is measured in benchmarks/."""
    proxy.add(Bandwidth(bytes_per_second=4 * 2**20, downloads=False))
    started = time.monotonic()
    client(proxy).put_object(Bucket=BUCKET, Key="big", Body=os.urandom(4 * 2**20))
    assert time.monotonic() - started >= 0.95
    (body, seconds), *_ = proxy.uploads[-1:]
    assert body == 4 * 2**20 and body / seconds <= 4 * 2**20 * 1.01


def test_latency_delays_every_request(proxy):
    proxy.add(Latency(seconds=0.3))
    started = time.monotonic()
    client(proxy).head_bucket(Bucket=BUCKET)
    assert time.monotonic() - started >= 0.3


def test_bad_setup_is_one_clear_message(moto):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BackendError, match=f"cannot start the moto S3 server on 127.0.0.1:{port}"):
            MotoS3(port=port).start()
        with pytest.raises(BackendError, match=f"cannot start the S3 fault proxy on 127.0.0.1:{port}"):
            FaultProxy(moto.endpoint, port=port).start()
    with pytest.raises(BackendError, match="loopback only"):
        FaultProxy("http://10.0.0.5:9000")
    with pytest.raises(ValueError, match="probability"):
        SlowDown(probability=1.5)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_s3_behind_the_proxy_is_a_clear_s3_error():
    unreachable = r"ServiceUnavailable.*cannot reach S3 at 127\.0\.0\.1:\d+"
    with FaultProxy(f"http://127.0.0.1:{closed_port()}") as dead, pytest.raises(ClientError, match=unreachable):
        client(dead).put_object(Bucket=BUCKET, Key="k", Body=b"x")


@pytest.mark.parametrize(
    ("case", "expected"),
    [("unreachable endpoint", "Could not connect to the endpoint URL"), ("missing bucket", "NoSuchBucket")],
)
def test_reference_trainer_names_an_unusable_s3_and_stops(spotchaos_s3, case, expected):
    """Not a traceback, not a fresh start over good checkpoints it cannot see: one line, exit 4."""
    env = {**os.environ, **spotchaos_s3.environment(), ENV_CHECKPOINT_URI: "s3://no-such-bucket/ckpt"}
    if case == "unreachable endpoint":
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{closed_port()}"
    argv = [sys.executable, str(FIXTURES / "reference_trainer.py"), "--steps", "4", "--s3-attempts", "1"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 4, done.stderr[-2000:]
    assert "fatal: cannot read checkpoints from S3" in done.stderr and expected in done.stderr
    assert "Traceback" not in done.stderr and spotchaos_s3.credentials.secret_key[:8] not in done.stderr


def test_moto_refuses_unknown_keys_only_while_iam_is_enforced(spotchaos_s3):
    """The IAM mode scenarios use: real InvalidAccessKeyId / AccessDenied from moto, and back to
    accepting anything afterwards (moto's switch is process-wide)."""
    with spotchaos_s3.iam():
        writer, reader = spotchaos_s3.issue(), spotchaos_s3.issue(read_only=True)
        spotchaos_s3.client(writer).create_bucket(Bucket=BUCKET)
        spotchaos_s3.client(writer).put_object(Bucket=BUCKET, Key="k", Body=b"x")
        assert spotchaos_s3.client(reader).get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"x"
        with pytest.raises(ClientError, match="AccessDenied"):
            spotchaos_s3.client(reader, attempts=1).put_object(Bucket=BUCKET, Key="k", Body=b"y")
        with pytest.raises(ClientError, match="InvalidAccessKeyId"):
            spotchaos_s3.client(Credentials(), attempts=1).list_objects_v2(Bucket=BUCKET)
    spotchaos_s3.client(Credentials()).list_objects_v2(Bucket=BUCKET)  # enforcement is off again


def test_plugin_fixture_gives_each_test_a_reset_s3_with_its_own_secret(pytester):
    pytester.makepyfile(
        test_s3="""
import pytest
from botocore.exceptions import ClientError
from spotchaos.storage import ExpiredToken

SEEN = []

@pytest.mark.parametrize("round", [1, 2])
def test_round(spotchaos_s3, round):
    s3 = spotchaos_s3.client()
    s3.create_bucket(Bucket="ckpts")  # would fail in round 2 without the reset
    env = spotchaos_s3.environment()
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert env["AWS_SECRET_ACCESS_KEY"] not in SEEN
    SEEN.append(env["AWS_SECRET_ACCESS_KEY"])
    spotchaos_s3.add(ExpiredToken())
    with pytest.raises(ClientError, match="ExpiredToken"):
        s3.put_object(Bucket="ckpts", Key="k", Body=b"x")
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
