"""Conditional writes on S3: a ``WriteCondition``'s arguments, and whether a store honours them.

The probe finds that out once per endpoint and bucket.

AWS S3 (since 2024), Ceph RGW and SeaweedFS answer ``412 PreconditionFailed`` to a PUT or a
``CompleteMultipartUpload`` whose ``If-Match``/``If-None-Match`` the object does not meet.
Other stores ignore the headers (and write anyway) or refuse them (``501 NotImplemented``).
Sending them blind would tell neither apart from success, so the probe writes a scratch
object beside the first key uploaded and asks for what must fail: a second create with
``If-None-Match: *``, a PUT and a completion with an ``If-Match`` no object has. Only a
store that refuses all three is trusted to fence; the scratch object is deleted after. A
store that cannot be reached (retries spent) gives no answer: ``StoreUnavailableError`` is
raised and nothing is concluded.
"""

from __future__ import annotations

import logging
import posixpath
import secrets
from collections.abc import Callable
from typing import Any

from tiercache.errors import ObjectChangedError, StoreUnavailableError, TierCacheError
from tiercache.store.base import WriteCondition

log = logging.getLogger("tiercache.store")

PROBE_PREFIX = ".tiercache-probe-"
_NO_SUCH_ETAG = '"00000000000000000000000000000000"'


def condition_arguments(condition: WriteCondition | None) -> dict[str, str]:
    """boto3's arguments for ``put_object``/``complete_multipart_upload`` that carry it."""
    if condition is None:
        return {}
    if condition.etag is None:
        return {"IfNoneMatch": "*"}
    return {"IfMatch": condition.etag}


# Runs one boto3 request, named by its S3 operation, through the store's gateway (retries,
# errors translated).
Probe = Callable[[str, Callable[[Any], Any]], Any]


def probe_conditional_writes(call: Probe, bucket: str, near_key: str) -> bool:
    """Whether the store refuses writes whose condition fails, found by trying three that must
    be refused (``call`` runs one boto3 request through the store's gateway). A store that
    accepts any of them, or refuses the headers themselves, does not fence; one that cannot be
    reached raises ``StoreUnavailableError``."""
    directory = posixpath.dirname(near_key)
    key = posixpath.join(directory, PROBE_PREFIX + secrets.token_hex(8))
    try:
        call("PutObject", lambda c: c.put_object(Bucket=bucket, Key=key, Body=b"", IfNoneMatch="*"))
    except StoreUnavailableError:
        raise
    except TierCacheError as exc:
        log.info("s3://%s: conditional writes not usable (%s)", bucket, exc)
        return False
    try:
        honoured = (
            _refused(
                call,
                "PutObject",
                lambda c: c.put_object(Bucket=bucket, Key=key, Body=b"", IfNoneMatch="*"),
            )
            and _refused(
                call,
                "PutObject",
                lambda c: c.put_object(Bucket=bucket, Key=key, Body=b"", IfMatch=_NO_SUCH_ETAG),
            )
            and _completion_refused(call, bucket, key)
        )
    finally:
        try:
            call("DeleteObject", lambda c: c.delete_object(Bucket=bucket, Key=key))
        except TierCacheError as exc:  # a user allowed to write but not to delete
            log.warning("s3://%s/%s: the probe's scratch object stays: %s", bucket, key, exc)
    return honoured


def _refused(call: Probe, op: str, request: Callable[[Any], Any]) -> bool:
    try:
        call(op, request)
    except ObjectChangedError:
        return True
    except StoreUnavailableError:
        raise
    except TierCacheError:
        return False  # refused for another reason (the header itself, a permission)
    return False  # written anyway: the condition was ignored


def _completion_refused(call: Probe, bucket: str, key: str) -> bool:
    try:
        created = call(
            "CreateMultipartUpload", lambda c: c.create_multipart_upload(Bucket=bucket, Key=key)
        )
    except StoreUnavailableError:
        raise
    except TierCacheError:
        return False
    upload_id = str(created["UploadId"])
    try:
        part = call(
            "UploadPart",
            lambda c: c.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"p"
            ),
        )
        parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
        return _refused(
            call,
            "CompleteMultipartUpload",
            lambda c: c.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload=parts,
                IfMatch=_NO_SUCH_ETAG,
            ),
        )
    finally:
        try:
            call(
                "AbortMultipartUpload",
                lambda c: c.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id),
            )
        except TierCacheError:
            pass  # completed (the condition was ignored) or aborted already
