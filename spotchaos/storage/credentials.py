"""Credential faults that act through moto's own IAM, not through the proxy.

The proxy can answer ``403`` in S3's place; these make moto itself refuse, with the signature
and policy checks AWS applies: the restarted job is handed other credentials than the run's.
Each names the S3 error code the job should meet, for the harness's message.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .service import Credentials

if TYPE_CHECKING:
    from .service import S3Service


@dataclass
class CredentialSwap(abc.ABC):
    """Base: the restart gets ``credentials(service)`` instead of the run's own key."""

    name: str = field(default="credential-swap", init=False)
    code: str = field(default="", init=False)  # what S3 answers the swapped key

    @abc.abstractmethod
    def credentials(self, service: S3Service) -> Credentials:
        """The key the restarted job is handed."""


@dataclass
class UnknownAccessKey(CredentialSwap):
    """A key S3 never issued (a typo, a key from another account, a deleted user): moto answers
    ``403 InvalidAccessKeyId`` from the very first request."""

    name: str = field(default="unknown-access-key", init=False)
    code: str = field(default="InvalidAccessKeyId", init=False)

    def credentials(self, service: S3Service) -> Credentials:
        return Credentials()  # random: never created in moto's IAM


@dataclass
class ReadOnlyKey(CredentialSwap):
    """An IAM user whose policy allows listing and reading only: the resume works, the first
    checkpoint upload gets moto's ``403 AccessDenied``."""

    name: str = field(default="read-only-key", init=False)
    code: str = field(default="AccessDenied", init=False)

    def credentials(self, service: S3Service) -> Credentials:
        return service.issue(read_only=True)
