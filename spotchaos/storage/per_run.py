"""The harness's S3 for one session, and each run's own corner of it.

Started by the session with the first job that checkpoints to S3 (moto on loopback behind the
fault proxy, stopped with the session's other resources). Each run gets a fresh bucket, so the
harness works on its own copies, and an IAM user of its own whose secret is unique to the run,
with moto checking signatures and policies while the run lasts.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from ..probe import ENV_CHECKPOINT_URI
from .moto_server import MotoS3
from .service import S3Service


class SessionS3:
    """moto behind the fault proxy, for one session; tests and scenarios add storage faults to
    ``service``. Every secret handed to a run is appended to ``secrets`` (redacted, and searched
    for in every output)."""

    def __init__(self, resources: contextlib.ExitStack, secrets: list[str]) -> None:
        moto = resources.enter_context(MotoS3())
        self.service: S3Service = resources.enter_context(S3Service(moto))
        self.secrets = secrets

    @contextlib.contextmanager
    def run_environment(self) -> Iterator[dict[str, str]]:
        """A run's storage environment: its bucket, its user's credentials, the endpoint."""
        with self.service.iam():
            credentials = self.service.issue()
            self.secrets.append(credentials.secret_key)
            bucket = f"spotchaos-{uuid.uuid4().hex[:12]}"
            self.service.client(direct=True).create_bucket(Bucket=bucket)
            yield {**self.service.environment(credentials), ENV_CHECKPOINT_URI: f"s3://{bucket}/ckpt"}
