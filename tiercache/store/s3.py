"""``S3Store``: the ObjectStore over boto3, with one gateway that retries and maps errors."""

from __future__ import annotations

import datetime
import email.utils
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions
import botocore.parsers
import botocore.utils
from botocore import UNSIGNED

from tiercache import forksafe
from tiercache.errors import (
    AccessDeniedError,
    NotImplementedByStoreError,
    ObjectChangedError,
    StoreError,
)
from tiercache.store.base import ListEntry, ObjectInfo, WriteCondition, WriteFence
from tiercache.store.conditional import condition_arguments, probe_conditional_writes
from tiercache.store.endpoint import AWS_NAMESPACE, canonical_endpoint, configured_endpoint
from tiercache.store.http_get import GetReply
from tiercache.store.multipart import PartGovernor, PartSender, SendsParts, part_size_for
from tiercache.store.retry import RetryableError, RetryPolicy
from tiercache.store.s3_errors import translate_client_error, translate_transport_error
from tiercache.store.s3_options import S3Options
from tiercache.store.signed_get import SignedGet, StoreRefusedError, reply_fields

__all__ = ["S3Options", "S3Store", "S3Stream"]

T = TypeVar("T")
log = logging.getLogger("tiercache.store")

_STREAM_CHUNK = 1024 * 1024


class S3Stream:
    """Body of a ranged GetObject; transport errors surface as ``RetryableError``.

    ``read`` and ``readinto`` read straight from a signed GET's reply, or from the
    ``http.client`` response under botocore/urllib3 when they can: botocore's ``read(n)``
    copies every byte twice more (measured: half the client CPU of a cold fetch). botocore
    asks urllib3 for undecoded content, so the bytes are the same.
    """

    def __init__(self, info: ObjectInfo, start: int, end: int, body: Any) -> None:
        self.info = info
        self.start = start
        self.end = end
        self._body = body
        # botocore's StreamingBody wraps urllib3's response; a signed GET's body is its reply.
        self._raw: Any = getattr(body, "_raw_stream", body)
        fp = body if isinstance(body, GetReply) else getattr(self._raw, "_fp", None)
        self._direct = fp if callable(getattr(fp, "readinto", None)) else None
        self._received = 0

    def read(self, amount: int) -> bytes:
        try:
            data = bytes((self._direct or self._body).read(amount))
        except Exception as exc:
            raise translate_transport_error(
                exc, "reading", self.info.bucket, self.info.key
            ) from exc
        self._received += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        if self._direct is None:
            data = self.read(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        try:
            count = int(self._direct.readinto(buffer))
        except Exception as exc:
            raise translate_transport_error(
                exc, "reading", self.info.bucket, self.info.key
            ) from exc
        self._received += count
        return count

    def close(self) -> None:
        complete = self._direct is not None and self._received == self.end - self.start
        if complete and callable(getattr(self._raw, "release_conn", None)):
            self._raw.release_conn()  # the body was read to its end: the connection is reusable
        else:
            self._body.close()


class S3Store(SendsParts):
    """An ObjectStore on S3 (AWS, IBM COS, Ceph RGW, MinIO, SeaweedFS) through boto3.

    boto3's own retries are off: every call goes through ``_call`` so that one policy decides,
    including for errors in the middle of a streamed body. The client is rebuilt in a forked
    child (boto3 clients must not cross ``fork``).
    """

    def __init__(
        self,
        options: S3Options | None = None,
        *,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_connections: int = 32,
        part_size: int = 16 * 1024 * 1024,
        upload_concurrency: int | None = None,
        max_parts_in_flight: int = 16,
    ) -> None:
        self.options = options or S3Options()
        # Resolved once, so requests, messages and the namespace name the same endpoint.
        self._endpoint_url = configured_endpoint(self.options.endpoint_url, os.environ)
        self._namespace = (
            AWS_NAMESPACE
            if self._endpoint_url is None
            else "s3:" + canonical_endpoint(self._endpoint_url)
        )
        self.retry = retry or RetryPolicy()
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._part_size = part_size
        self._sender = PartSender(PartGovernor(upload_concurrency, max_parts_in_flight))
        self._client: Any = None
        self._signed_get: SignedGet | None = None
        self._client_lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        # Whether the store honours conditional writes, by bucket (False once it refused them,
        # or as probed): a property of the server, so a forked child keeps what its parent
        # found.
        self._conditional: dict[str, bool] = {}
        self._conditional_lock = threading.Lock()
        forksafe.register(self)

    def after_fork(self) -> None:
        self._client = None
        self._signed_get = None
        self._client_lock = threading.Lock()
        self._counts = Counter()
        self._errors = Counter()
        self._counts_lock = threading.Lock()
        self._conditional_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Store(endpoint_url={self._endpoint_url!r}, region={self.options.region!r})"

    @property
    def namespace(self) -> str:
        """``s3:`` and the canonical endpoint (``s3:aws`` without one): one name per store."""
        return self._namespace

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to as configured, for messages; endpoints with userinfo
        are refused, so it never carries credentials."""
        return self._endpoint_url or "aws"

    # -- the gateway -------------------------------------------------------------------------

    def client(self) -> Any:
        """The boto3 client of this process, built on first use and after a fork."""
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._build_client()
                    self._signed_get = SignedGet.for_client(self._client, self.options.anon)
                client = self._client
        return client

    def _build_client(self) -> Any:
        opts = self.options
        session = boto3.session.Session(profile_name=opts.profile) if opts.profile else None
        config = botocore.config.Config(
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=self._max_connections,
            s3={"addressing_style": opts.addressing_style},
            signature_version=UNSIGNED if opts.anon else None,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        kwargs: dict[str, Any] = {"config": config}
        if self._endpoint_url is not None:
            kwargs["endpoint_url"] = self._endpoint_url
        if opts.region:
            kwargs["region_name"] = opts.region
        if opts.key is not None:
            kwargs["aws_access_key_id"] = opts.key
            kwargs["aws_secret_access_key"] = opts.secret
            kwargs["aws_session_token"] = opts.token
        if opts.verify is not None:
            kwargs["verify"] = opts.verify
        client = (session or boto3).client("s3", **kwargs)
        _parse_timestamps_quickly(client)
        return client

    def _call(
        self,
        op: str,
        bucket: str,
        key: str,
        request: Callable[[Any], T],
        fence: WriteFence | None = None,
    ) -> T:
        """Run one request under the retry policy, translating errors to tiercache's; a
        ``fence`` is checked before every attempt (a retry is a new request on the wire)."""

        def attempt() -> T:
            if fence is not None:
                fence.check()
            with self._counts_lock:
                self._counts[op] += 1
            try:
                return request(self.client())
            except botocore.exceptions.ClientError as exc:
                raise translate_client_error(exc, op, bucket, key, self.endpoint) from None
            except botocore.exceptions.NoCredentialsError:
                raise AccessDeniedError(
                    f"{op} s3://{bucket}/{key}: no credentials found; pass key/secret in the "
                    "s3 options or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
                ) from None
            except (RetryableError, StoreError):
                raise
            except Exception as exc:
                raise translate_transport_error(exc, op, bucket, key) from exc

        def counted() -> T:
            try:
                return attempt()
            except (FileNotFoundError, ObjectChangedError):  # answers, not failures
                raise
            except Exception:
                with self._counts_lock:
                    self._errors[op] += 1
                raise

        where = f"{op} s3://{bucket}/{key} at {self.endpoint}"
        return self.retry.run(counted, where)

    def request_counts(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self._counts)

    def error_counts(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self._errors)

    # -- reads -------------------------------------------------------------------------------

    def head(self, bucket: str, key: str) -> ObjectInfo:
        resp = self._call(
            "HeadObject", bucket, key, lambda c: c.head_object(Bucket=bucket, Key=key)
        )
        return _info(bucket, key, resp["ContentLength"], resp)

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> S3Stream:
        def request(client: Any) -> Any:
            args: dict[str, Any] = {"Bucket": bucket, "Key": key}
            if end is None or end > start:
                args["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
            if if_match:
                args["IfMatch"] = if_match
            signed = self._signed_get
            if signed is not None and signed.serves(bucket):
                headers = {"Range": args["Range"]} if "Range" in args else {}
                if if_match:
                    headers["If-Match"] = if_match
                try:
                    raw = signed.get(bucket, key, headers)
                except StoreRefusedError as refused:
                    refused_code = refused.client_error.response["Error"]["Code"]
                    if not (refused_code == "InvalidRange" and start == 0):
                        raise refused.client_error from None
                except LookupError:
                    pass  # asked again through boto3 (below)
                else:
                    return {**reply_fields(raw.headers), "Body": raw}
                with self._counts_lock:
                    self._counts["GetObject"] += 1
            try:
                return client.get_object(**args)
            except botocore.exceptions.ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if code == "InvalidRange" and start == 0:  # an empty object has no byte 0
                    args.pop("Range", None)
                    return client.get_object(**args)
                raise

        resp = self._call("GetObject", bucket, key, request)
        total = _total_size(resp)
        info = _info(bucket, key, total, resp)
        stop = total if end is None else min(end, total)
        return S3Stream(info, start, stop, resp["Body"])

    def list_objects(
        self, bucket: str, prefix: str, delimiter: str | None = "/"
    ) -> Iterator[ListEntry]:
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if delimiter:
                args["Delimiter"] = delimiter
            if token:
                args["ContinuationToken"] = token
            page: Any = self._call("ListObjectsV2", bucket, prefix, _lister(args))
            for common in page.get("CommonPrefixes", []):
                yield ListEntry(bucket, common["Prefix"].rstrip("/"), "directory")
            for obj in page.get("Contents", []):
                yield ListEntry(
                    bucket,
                    obj["Key"],
                    "file",
                    size=obj["Size"],
                    etag=obj.get("ETag"),
                    last_modified=obj["LastModified"].timestamp()
                    if obj.get("LastModified")
                    else None,
                )
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def list_buckets(self) -> list[str]:
        resp = self._call("ListBuckets", "", "", lambda c: c.list_buckets())
        return [b["Name"] for b in resp.get("Buckets", [])]

    # -- writes ------------------------------------------------------------------------------

    def put_bytes(
        self,
        bucket: str,
        key: str,
        data: bytes,
        metadata: Mapping[str, str] | None = None,
        fence: WriteFence | None = None,
    ) -> ObjectInfo:
        condition = fence.condition() if fence is not None else None

        def put(arguments: dict[str, str]) -> Any:
            return self._call(
                "PutObject",
                bucket,
                key,
                lambda c: c.put_object(
                    Bucket=bucket, Key=key, Body=data, Metadata=dict(metadata or {}), **arguments
                ),
                fence,
            )

        return _info(bucket, key, len(data), self._conditionally(bucket, condition, put))

    def upload_file(
        self,
        bucket: str,
        key: str,
        path: str,
        metadata: Mapping[str, str] | None = None,
        on_multipart: Callable[[str], None] | None = None,
        fence: WriteFence | None = None,
    ) -> ObjectInfo:
        size = os.path.getsize(path)
        if size <= self._part_size:
            with open(path, "rb") as f:
                return self.put_bytes(bucket, key, f.read(), metadata, fence)
        upload = self.start_multipart(bucket, key, metadata, on_multipart, fence)
        part_size = part_size_for(size, self._part_size)
        try:
            for number, offset in enumerate(range(0, size, part_size), start=1):
                upload.add_part(number, partial(_read_part, path, offset, part_size))
        except BaseException:
            upload.abort()
            raise
        return upload.complete()

    @property
    def part_size(self) -> int:
        return self._part_size

    def create_multipart(self, bucket: str, key: str, metadata: Mapping[str, str]) -> str:
        created = self._call(
            "CreateMultipartUpload",
            bucket,
            key,
            lambda c: c.create_multipart_upload(Bucket=bucket, Key=key, Metadata=dict(metadata)),
        )
        return str(created["UploadId"])

    def send_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        resp = self._call(
            "UploadPart",
            bucket,
            key,
            lambda c: c.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            ),
        )
        return str(resp["ETag"])

    def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        etags: list[tuple[int, str]],
        size: int,
        condition: WriteCondition | None = None,
    ) -> ObjectInfo:
        parts = [{"PartNumber": number, "ETag": etag} for number, etag in etags]

        def complete(arguments: dict[str, str]) -> Any:
            return self._call(
                "CompleteMultipartUpload",
                bucket,
                key,
                lambda c: c.complete_multipart_upload(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    **arguments,
                ),
            )

        return _info(bucket, key, size, self._conditionally(bucket, condition, complete))

    def _conditionally(
        self,
        bucket: str,
        condition: WriteCondition | None,
        send: Callable[[dict[str, str]], T],
    ) -> T:
        """Send a write with ``condition``'s headers, unless the store refused them in this
        bucket; a first refusal (501) is remembered and the write sent again without."""
        if condition is None or not self.conditional_writes(bucket):
            return send({})
        try:
            return send(condition_arguments(condition))
        except NotImplementedByStoreError:
            self.conditions_refused(bucket)
            return send({})

    def conditional_writes(self, bucket: str, near_key: str = "") -> bool:
        """False once the store refused the conditional headers of a write in ``bucket``
        (501); until then writes are sent with their condition. A store that ignores the
        headers cannot be told from one that honours them by a write that succeeds:
        ``probe_conditional_writes`` (``tiercache doctor``) finds that out."""
        with self._conditional_lock:
            return self._conditional.get(bucket, True)

    def probe_conditional_writes(self, bucket: str, near_key: str = "") -> bool:
        """Whether the store refuses a PUT and a completion whose condition fails, tried with
        a scratch object beside ``near_key`` (``store/conditional.py``); remembered. A store
        that cannot be reached raises ``StoreUnavailableError`` and nothing is remembered."""

        def call(op: str, request: Callable[[Any], Any]) -> Any:
            return self._call(op, bucket, near_key, request)

        honoured = probe_conditional_writes(call, bucket, near_key)
        with self._conditional_lock:
            self._conditional[bucket] = honoured
        return honoured

    def conditions_refused(self, bucket: str) -> None:
        """The store refused conditional writes in ``bucket`` (501), or misjudged one (412 for
        a condition that held): its writes go without conditions from now on."""
        with self._conditional_lock:
            known = self._conditional.get(bucket)
            self._conditional[bucket] = False
        if known is not False:
            log.warning(
                "%s, bucket %s: the store refuses or misjudges conditional writes; uploads are "
                "fenced by their claim alone",
                self.endpoint,
                bucket,
            )

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        try:
            self._call(
                "AbortMultipartUpload",
                bucket,
                key,
                lambda c: c.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id),
            )
        except StoreError:
            pass  # the bucket's lifecycle rules reap what an abort could not

    def delete(self, bucket: str, keys: Iterable[str]) -> None:
        batch: list[str] = []
        for key in keys:
            batch.append(key)
            if len(batch) == 1000:  # DeleteObjects takes at most 1000 keys
                self._delete_batch(bucket, batch)
                batch = []
        if batch:
            self._delete_batch(bucket, batch)

    def _delete_batch(self, bucket: str, keys: list[str]) -> None:
        if len(keys) == 1:
            self._call(
                "DeleteObject",
                bucket,
                keys[0],
                lambda c: c.delete_object(Bucket=bucket, Key=keys[0]),
            )
            return
        resp = self._call(
            "DeleteObjects",
            bucket,
            keys[0],
            lambda c: c.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
            ),
        )
        errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            first = errors[0]
            raise translate_client_error(
                botocore.exceptions.ClientError({"Error": first}, "DeleteObjects"),
                "DeleteObjects",
                bucket,
                first.get("Key", ""),
                self.endpoint,
            )

    def copy(self, src_bucket: str, src_key: str, dst_bucket: str, dst_key: str) -> None:
        self._call(
            "CopyObject",
            dst_bucket,
            dst_key,
            lambda c: c.copy(
                {"Bucket": src_bucket, "Key": src_key},
                dst_bucket,
                dst_key,
            ),
        )

    def user_metadata(self, bucket: str, key: str) -> tuple[ObjectInfo, dict[str, str]]:
        """The object's info and its user metadata (``x-amz-meta-*``, without the prefix)."""
        resp = self._call(
            "HeadObject", bucket, key, lambda c: c.head_object(Bucket=bucket, Key=key)
        )
        return _info(bucket, key, resp["ContentLength"], resp), dict(resp.get("Metadata") or {})

    def replace_metadata(
        self, bucket: str, key: str, metadata: Mapping[str, str], if_match: str
    ) -> None:
        """Replace the user metadata of the object whose ETag is ``if_match`` (a CopyObject
        onto itself; a changed object fails with a precondition error and keeps its own)."""
        self._call(
            "CopyObject",
            bucket,
            key,
            lambda c: c.copy_object(
                Bucket=bucket,
                Key=key,
                CopySource={"Bucket": bucket, "Key": key},
                CopySourceIfMatch=if_match,
                Metadata=dict(metadata),
                MetadataDirective="REPLACE",
            ),
        )

    def create_bucket(self, bucket: str) -> None:
        self._call("CreateBucket", bucket, "", lambda c: c.create_bucket(Bucket=bucket))

    def delete_bucket(self, bucket: str) -> None:
        self._call("DeleteBucket", bucket, "", lambda c: c.delete_bucket(Bucket=bucket))


def _read_part(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _lister(args: dict[str, Any]) -> Callable[[Any], Any]:
    return lambda client: client.list_objects_v2(**args)


def _parse_timestamps_quickly(client: Any) -> None:
    """Give ``client`` (and only it) a parser factory whose timestamps are read by the
    standard library: botocore's default (dateutil) took most of a LIST page's CPU, 1000
    LastModified values a page, and with it revalidation by listing."""
    endpoint = getattr(client, "_endpoint", None)
    if endpoint is None or not hasattr(endpoint, "_response_parser_factory"):
        return
    factory = botocore.parsers.ResponseParserFactory()
    factory.set_parser_defaults(timestamp_parser=parse_timestamp)
    endpoint._response_parser_factory = factory


def parse_timestamp(value: Any) -> datetime.datetime:
    """A timestamp as S3 writes them (ISO 8601 in bodies, RFC 1123 in headers), UTC-aware;
    anything else as botocore reads it."""
    if isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            try:
                parsed = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return botocore.utils.parse_timestamp(value)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.timezone.utc)
        return parsed
    return botocore.utils.parse_timestamp(value)


def _total_size(resp: Mapping[str, Any]) -> int:
    content_range = resp.get("ContentRange")
    if content_range and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total != "*":
            return int(total)
    return int(resp["ContentLength"])


def _info(bucket: str, key: str, size: int, resp: Mapping[str, Any]) -> ObjectInfo:
    modified = resp.get("LastModified")
    return ObjectInfo(
        bucket=bucket,
        key=key,
        size=size,
        etag=str(resp.get("ETag", "")),
        last_modified=modified.timestamp() if modified is not None else None,
    )
