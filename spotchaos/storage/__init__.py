"""Object storage for chaos: moto's S3 on loopback, and a fault proxy in front of it."""

from .credentials import CredentialSwap, ReadOnlyKey, UnknownAccessKey
from .faults import (
    Bandwidth,
    ExpiredToken,
    Fault,
    Hang,
    InternalError,
    InvalidCredentials,
    Latency,
    ReadOnly,
    Request,
    ResetMidUpload,
    S3Error,
    SlowDown,
)
from .moto_server import MotoS3
from .proxy import FaultProxy
from .service import Credentials, S3Service

__all__ = [
    "Bandwidth",
    "CredentialSwap",
    "Credentials",
    "ExpiredToken",
    "Fault",
    "FaultProxy",
    "Hang",
    "InternalError",
    "InvalidCredentials",
    "Latency",
    "MotoS3",
    "ReadOnly",
    "ReadOnlyKey",
    "Request",
    "ResetMidUpload",
    "S3Error",
    "S3Service",
    "SlowDown",
    "UnknownAccessKey",
]
