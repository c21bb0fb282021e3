"""The S3 service a job sees: moto behind the fault proxy, with credentials made for this run.

Each :class:`S3Service` makes a fresh access key and a unique secret, so a leak of the secret
anywhere in what the harness captured can be searched for exactly (and redacted by the report).
Jobs receive everything through their environment (``environment()``), as on a real cloud.

Inside ``with service.iam():`` moto checks signatures and IAM policies like AWS does, and
``issue()`` makes an IAM user with its own key for one run: then a wrong key, a revoked key or a
read-only user get moto's own ``InvalidAccessKeyId`` / ``AccessDenied``, not the proxy's.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType

from ..extras import require
from .faults import Fault
from .moto_server import MotoS3
from .proxy import FaultProxy

REGION = "us-east-1"
READ_ACTIONS = ["s3:GetObject", "s3:ListBucket", "s3:HeadObject", "s3:GetBucketLocation"]


@dataclass
class Credentials:
    access_key: str = field(default_factory=lambda: "AKIA" + secrets.token_hex(8).upper())
    # all random: a fixed prefix would make "the first 8 characters" match harmless text
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))


class S3Service:
    """``with S3Service(moto) as s3:`` a fault proxy in front of a (reset) moto server."""

    def __init__(self, moto: MotoS3) -> None:
        self.moto = moto
        self.proxy = FaultProxy(moto.endpoint)
        self.credentials = Credentials()
        self._admin: Credentials | None = None  # the harness's own key while IAM is enforced

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    def add(self, fault: Fault) -> Fault:
        return self.proxy.add(fault)

    def remove(self, fault: Fault) -> None:
        self.proxy.remove(fault)

    def clear(self) -> None:
        self.proxy.clear()

    def environment(self, credentials: Credentials | None = None) -> dict[str, str]:
        """What a job needs to reach this S3 (and nothing else: no instance metadata lookups)."""
        creds = credentials or self.credentials
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": creds.access_key,
            "AWS_SECRET_ACCESS_KEY": creds.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_RETRY_MODE": "standard",
        }

    def client(self, credentials: Credentials | None = None, *, direct: bool = False, **config):
        """A boto3 S3 client with these credentials and the standard retry mode; ``direct`` goes
        to moto past the fault proxy (the harness's own setup is not the job's traffic)."""
        boto3 = require("boto3", "s3", "S3 storage")
        Config = require("botocore.config", "s3", "S3 storage").Config

        creds = credentials or self._admin or self.credentials
        return boto3.client(
            "s3",
            endpoint_url=self.moto.endpoint if direct else self.endpoint,
            region_name=REGION,
            aws_access_key_id=creds.access_key,
            aws_secret_access_key=creds.secret_key,
            config=Config(retries={"mode": "standard", "total_max_attempts": config.pop("attempts", 5)}, **config),
        )

    def _iam_client(self):
        boto3 = require("boto3", "s3", "S3 storage")

        creds = self._admin or self.credentials
        return boto3.client(
            "iam",
            endpoint_url=self.moto.endpoint,
            region_name=REGION,
            aws_access_key_id=creds.access_key,
            aws_secret_access_key=creds.secret_key,
        )

    def issue(self, *, read_only: bool = False) -> Credentials:
        """A new IAM user with its own key: may do anything in S3, or only read. Its secret is
        made by moto, so it is unique to the run it is issued for."""
        return self._new_user(READ_ACTIONS if read_only else ["s3:*"])

    def _new_user(self, actions: list[str] | str) -> Credentials:
        iam = self._iam_client()
        name = f"spotchaos-{secrets.token_hex(6)}"
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="spotchaos", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return Credentials(key["AccessKeyId"], key["SecretAccessKey"])

    @contextlib.contextmanager
    def iam(self) -> Iterator[S3Service]:
        """Enforce signatures and IAM policies for the duration; the harness's own calls (bucket
        set-up, digests) use an admin user made on entry."""
        self._admin = None
        self._admin = self._new_user("*")
        self.moto.enforce_auth(True)
        try:
            yield self
        finally:
            self.moto.enforce_auth(False)
            self._admin = None

    def object_digests(self, bucket: str) -> dict[str, str]:
        """sha256 of every object in ``bucket``, read past the fault proxy: the before/after evidence."""
        import hashlib

        s3 = self.client(direct=True)
        digests = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                digests[item["Key"]] = hashlib.sha256(body).hexdigest()
        return digests

    def __enter__(self) -> S3Service:
        self.moto.reset()
        self.proxy.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.proxy.stop()
