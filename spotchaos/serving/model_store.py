"""Where a service's model comes from: an object in the harness's S3 (moto, on 127.0.0.1), read
through a cache directory the platform keeps from one instance to the next.

The harness uploads the model file past the fault proxy (its own setup is not the service's
traffic), optionally throttles the service's downloads (a cold start from a real bucket takes
time), and can publish a new version under the same key while the cache still holds the old one:
the replacement must notice, not serve the stale copy. The service learns where everything is
from its environment: the S3 variables the AWS SDKs read, ``SPOTCHAOS_MODEL_URL`` and
``SPOTCHAOS_MODEL_CACHE``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from types import TracebackType

from ..config.services import ModelSpec
from ..errors import ConfigError
from ..storage import Bandwidth, S3Service

ENV_MODEL_URL = "SPOTCHAOS_MODEL_URL"
ENV_MODEL_CACHE = "SPOTCHAOS_MODEL_CACHE"
MAX_MODEL_BYTES = 1 << 30


class ModelStore:
    """``with ModelStore(s3, model, root, cache) as store:`` the model uploaded; ``store.environment``
    for the service; ``store.publish_update()`` puts the new version under the same key."""

    def __init__(self, s3: S3Service, model: ModelSpec, root: Path, cache: Path) -> None:
        self.s3, self.model, self.root, self.cache = s3, model, root, cache
        self.bucket = f"spotchaos-models-{uuid.uuid4().hex[:12]}"
        self.fault: Bandwidth | None = None
        self.updated = False

    def _body(self, name: str, key: str) -> bytes:
        path = self.root / name
        try:
            if path.stat().st_size > MAX_MODEL_BYTES:
                raise ConfigError(f"model.{key}: {path} is over 1 GiB; the harness uploads it to a local S3")
            return path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"model.{key}: cannot read {path}: {exc.strerror or exc}") from None

    def __enter__(self) -> ModelStore:
        body = self._body(self.model.file, "file")
        if self.model.updated_file:
            self._body(self.model.updated_file, "updated_file")  # a bad path fails before anything starts
        client = self.s3.client(direct=True)
        client.create_bucket(Bucket=self.bucket)
        client.put_object(Bucket=self.bucket, Key=self.model.key, Body=body)
        self.cache.mkdir(parents=True, exist_ok=True)
        if self.model.cold_bandwidth:
            self.fault = self.s3.add(Bandwidth(self.model.cold_bandwidth, uploads=False))
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self.fault is not None:
            self.s3.remove(self.fault)

    @property
    def environment(self) -> dict[str, str]:
        return {
            **self.s3.environment(),
            ENV_MODEL_URL: f"s3://{self.bucket}/{self.model.key}",
            ENV_MODEL_CACHE: str(self.cache),
        }

    def publish_update(self) -> None:
        """The new version under the same key: the cache now holds a stale copy."""
        assert self.model.updated_file is not None
        body = self._body(self.model.updated_file, "updated_file")
        self.s3.client(direct=True).put_object(Bucket=self.bucket, Key=self.model.key, Body=body)
        self.updated = True
