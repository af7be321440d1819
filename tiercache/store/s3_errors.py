"""The table that maps S3 error codes and transport failures to tiercache's exceptions."""

from __future__ import annotations

import re
from typing import Any

import botocore.exceptions

from tiercache.errors import (
    AccessDeniedError,
    NotImplementedByStoreError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
    TierCacheError,
)
from tiercache.store.retry import RetryableError

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "404", "NotFound", "NoSuchUpload"}
_DENIED = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
    "AccountProblem",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
}
_CHANGED = {"PreconditionFailed", "412"}
_NOT_IMPLEMENTED = {"NotImplemented", "501"}
_WRITES = {"PutObject", "CompleteMultipartUpload"}
_RETRYABLE = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "OperationAborted",
}

# Transport failures (connection refused/reset, timeouts, truncated bodies) are retried.
_TRANSPORT = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.HTTPClientError,
    ConnectionError,
    TimeoutError,
)


def translate_client_error(
    exc: botocore.exceptions.ClientError, op: str, bucket: str, key: str, endpoint: str = ""
) -> Exception:
    """Map an error response from S3 to a built-in-compatible tiercache exception."""
    error: Any = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    at = f" at {endpoint}" if endpoint else ""
    message = str(error.get("Message") or code)
    text = f"{op} {where}{at}: {code}: {message}"
    if code in _NOT_FOUND:
        kind = "bucket" if code == "NoSuchBucket" else "object"
        return ObjectNotFoundError(2, f"{op}: no such {kind}{at}", where)
    if code in _DENIED:
        return AccessDeniedError(13, f"{op}: access denied ({code}){at}", where)
    if code in _CHANGED and op in _WRITES:
        return ObjectChangedError(
            f"{op} {where}{at}: the store holds another version than the one this write was "
            "made against (a conditional write refused)"
        )
    if code in _CHANGED:
        return ObjectChangedError(f"{op} {where}{at}: the object changed while it was being read")
    if code in _NOT_IMPLEMENTED or status == 501:
        return NotImplementedByStoreError(text)
    if code in _RETRYABLE or (isinstance(status, int) and status >= 500):
        return RetryableError(text)
    return StoreError(text)


def translate_transport_error(exc: Exception, op: str, bucket: str, key: str) -> Exception:
    """Classify a failure below HTTP: retry it when it is a connection or timeout problem."""
    if isinstance(exc, (RetryableError, TierCacheError)):
        return exc
    if isinstance(exc, _TRANSPORT) or _is_urllib3_failure(exc):
        return RetryableError(
            f"{op} s3://{bucket}/{key}: {transport_cause(exc)} ({type(exc).__name__}: {exc})"
        )
    return StoreError(f"{op} s3://{bucket}/{key}: {type(exc).__name__}: {exc}")


_CAUSES = (
    (re.compile(r"read timeout=([\d.]+)"), "read timeout after {} s (the store did not answer)"),
    (re.compile(r"connect timeout=([\d.]+)"), "connect timeout after {} s"),
    (re.compile(r"Connection refused"), "connection refused"),
    (re.compile(r"Connection reset"), "connection reset by the store"),
    (re.compile(r"Name or service not known|nodename nor servname"), "unknown host name"),
    (re.compile(r"No route to host|Network is unreachable"), "no route to the store"),
)


def transport_cause(exc: BaseException) -> str:
    """What went wrong below HTTP, in a few words ("read timeout after 2 s", "connection
    refused"): botocore's own message names only the URL."""
    inner = getattr(exc, "kwargs", {}).get("error") or exc.__context__ or exc.__cause__
    text = f"{exc} {inner if inner is not None else ''}"
    for pattern, words in _CAUSES:
        found = pattern.search(text)
        if found:
            return words.format(*found.groups())
    if isinstance(exc, botocore.exceptions.ConnectionClosedError):
        return "the store closed the connection before answering"
    if isinstance(
        exc, (botocore.exceptions.IncompleteReadError, botocore.exceptions.ResponseStreamingError)
    ):
        return "the answer was cut short"
    return str(inner or exc) or type(exc).__name__


def _is_urllib3_failure(exc: Exception) -> bool:
    module = type(exc).__module__
    return module.startswith("urllib3") or module.startswith("http.client")
