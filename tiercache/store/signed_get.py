"""``SignedGet``: GetObject signed here and sent on connections of its own.

A GetObject through a boto3 client costs about 1 ms of client CPU before the first byte:
parameter validation, endpoint rules, a dozen events, the user agent, the signer, a parser that
reads every header (and a date parser for Last-Modified). For an object of 128 KiB that is more
than reading and caching its bytes, and a dataset of loose files pays it per file. A GET needs
little of it: this module signs the request (SigV4, the one HMAC chain per day and region
cached) and sends it on keep-alive connections of its own (``http_get``), with the timeouts,
pool size, socket options and certificate checking of the client's own HTTP session. A client
with a proxy or a client certificate leaves every GET to boto3.

What the client resolved is learnt, not re-implemented: the URL of a bucket (addressing style,
regional host, custom endpoint) and the signing region come from one presigned URL per bucket,
and the credentials from the client's signer, refreshed as botocore refreshes them. A reply
other than 200/206 is read for its S3 error code and mapped by the same rules as a boto3
error. A redirect or an authorization error the client itself would not get (a bucket in
another region, a request this module signed wrongly) makes the caller repeat the request
through boto3 and stop using this path for the bucket.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import threading
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import SplitResult, parse_qs, quote, urlsplit
from xml.etree import ElementTree

import botocore.exceptions

from tiercache.store.http_get import GetConnections, GetReply, ssl_context_for

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_PROBE_KEY = "tiercache-probe"
_ORIGINS_KEPT = 10  # botocore's pool manager keeps 10 hosts' pools (urllib3's default)
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")
# Replies that mean the request, not the object, was wrong for this bucket: boto3 follows
# the redirect or re-resolves the region, so the caller repeats it through boto3.
_ASK_BOTO3 = {301, 307, 400}
# A signature the server does not accept: wrong here, or wrong for boto3 as well (a bad
# secret), which boto3's own request then reports.
_ASK_BOTO3_CODES = {"SignatureDoesNotMatch", "AuthorizationHeaderMalformed"}


class StoreRefusedError(Exception):
    """The store answered with an error: ``client_error`` is it as boto3 would raise it."""

    def __init__(self, client_error: botocore.exceptions.ClientError, status: int) -> None:
        super().__init__(str(client_error))
        self.client_error = client_error
        self.status = status


class SignedGet:
    """Signed GETs for one process's boto3 client (built again with it after a fork)."""

    def __init__(self, client: Any, anonymous: bool) -> None:
        self._client = client
        self._anonymous = anonymous
        signer = getattr(client, "_request_signer", None)
        self._credentials: Any = getattr(signer, "_credentials", None)
        session = client._endpoint.http_session
        timeout = session._timeout  # a number, or urllib3's Timeout(connect, read)
        self._connect_timeout = getattr(timeout, "connect_timeout", timeout)
        self._read_timeout = getattr(timeout, "read_timeout", timeout)
        self._keep = int(session._max_pool_connections)
        self._socket_options = list(session._socket_options or ())
        self._verify = session._verify
        self._client_cert = session._cert_file
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[str, str, str] | None] = {}  # url prefix, host, region
        self._keys: dict[tuple[str, str, str], bytes] = {}  # (secret, day, region) -> key
        self._origins: dict[str, GetConnections] = {}  # scheme://netloc -> its connections

    @classmethod
    def for_client(cls, client: Any, anonymous: bool) -> SignedGet | None:
        """The signed-GET path for ``client``, or None where it cannot stand in for boto3
        (a proxy or a client certificate configured, no credentials to sign with, an
        unfamiliar botocore)."""
        if any(os.environ.get(name) for name in _PROXY_VARIABLES):
            return None
        if getattr(client.meta.config, "proxies", None):
            return None
        try:
            signed = cls(client, anonymous)
        except AttributeError:
            return None
        if signed._client_cert is not None:
            return None
        if not anonymous and signed._credentials is None:
            return None
        return signed

    def serves(self, bucket: str) -> bool:
        """Whether requests for ``bucket`` go this way (learning its URL on first use)."""
        with self._lock:
            if bucket in self._buckets:
                return self._buckets[bucket] is not None
        target = self._learn(bucket)
        with self._lock:
            self._buckets.setdefault(bucket, target)
            return self._buckets[bucket] is not None

    def refuse(self, bucket: str) -> None:
        """Stop using this path for ``bucket``: boto3 got what this path did not."""
        with self._lock:
            self._buckets[bucket] = None

    def _learn(self, bucket: str) -> tuple[str, str, str] | None:
        try:
            url = self._client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": _PROBE_KEY}, ExpiresIn=60
            )
        except Exception:
            return None
        parts = urlsplit(url)
        if not parts.path.endswith("/" + _PROBE_KEY):
            return None
        prefix = f"{parts.scheme}://{parts.netloc}{parts.path[: -len(_PROBE_KEY)]}"
        version = self._client.meta.config.signature_version
        if version not in (None, "s3v4", "v4") and not self._anonymous:
            return None  # the client signs another way: leave it to boto3
        # A presigned URL may carry SigV2 (boto3's default for presigning some regions);
        # requests are SigV4 in the client's region unless the URL's scope says otherwise.
        region = self._client.meta.region_name or "us-east-1"
        scope = parse_qs(parts.query).get("X-Amz-Credential", [""])[0].split("/")
        if len(scope) == 5:
            region = scope[2]
        host = parts.netloc
        default_port = {"http": ":80", "https": ":443"}.get(parts.scheme, "")
        if default_port and host.endswith(default_port):
            host = host[: -len(default_port)]
        return prefix, host, region

    def get(self, bucket: str, key: str, headers: Mapping[str, str]) -> GetReply:
        """Send the GET; the reply (200 or 206, body unread).

        Raises ``StoreRefusedError`` for an error reply, ``LookupError`` for one the caller
        should repeat through boto3 (the bucket is then refused), and botocore's transport
        errors as ``ConnectionError`` or ``TimeoutError``.
        """
        with self._lock:
            target = self._buckets.get(bucket)
        if target is None:
            raise LookupError(bucket)
        prefix, host, region = target
        parts = urlsplit(prefix + quote(key, safe="/~"))
        signed = self._sign(host, parts.path, region, headers)
        raw = self._connections(parts).get(parts.path, host, signed)
        status = raw.status
        if status in (200, 206):
            return raw
        body = raw.read(64 * 1024)
        # What an error reply holds beyond that is read and dropped before the connection
        # goes back to the pool: left unread, it would be taken for the next reply's start.
        raw.drain_conn()
        raw.release_conn()
        error = _client_error(status, raw.headers, body)
        if status in _ASK_BOTO3 or error.response["Error"]["Code"] in _ASK_BOTO3_CODES:
            self.refuse(bucket)
            raise LookupError(bucket)
        raise StoreRefusedError(error, status)

    def _connections(self, parts: SplitResult) -> GetConnections:
        """The connections to the URL's origin, made on first use (for as many origins as the
        client's session keeps pools for)."""
        origin = f"{parts.scheme}://{parts.netloc}"
        connections = self._origins.get(origin)
        if connections is not None:
            return connections
        port = parts.port or (443 if parts.scheme == "https" else 80)
        made = GetConnections(
            parts.scheme,
            parts.hostname or "",
            port,
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            keep=self._keep,
            ssl_context=ssl_context_for(self._verify) if parts.scheme == "https" else None,
            socket_options=self._socket_options,
        )
        with self._lock:
            connections = self._origins.get(origin)
            if connections is None:
                if len(self._origins) >= _ORIGINS_KEPT:
                    for old in self._origins.values():
                        old.close()
                    self._origins.clear()
                self._origins[origin] = connections = made
        if connections is not made:
            made.close()
        return connections

    def _sign(self, host: str, path: str, region: str, extra: Mapping[str, str]) -> dict[str, str]:
        now = time.gmtime()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", now)
        headers = {
            "host": host,
            "x-amz-content-sha256": EMPTY_SHA256,
            "x-amz-date": stamp,
            **{name.lower(): value for name, value in extra.items()},
        }
        if self._anonymous:
            del headers["host"]
            return headers
        creds = self._credentials.get_frozen_credentials()
        if creds.token:
            headers["x-amz-security-token"] = creds.token
        names = sorted(headers)
        canonical = "\n".join(
            (
                "GET",
                path,
                "",
                "".join(f"{n}:{' '.join(headers[n].split())}\n" for n in names),
                ";".join(names),
                EMPTY_SHA256,
            )
        )
        day = stamp[:8]
        scope = f"{day}/{region}/s3/aws4_request"
        to_sign = "\n".join(
            ("AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest())
        )
        signature = hmac.new(
            self._signing_key(creds.secret_key, day, region), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        del headers["host"]  # sent by the connection as signed (the URL's host)
        return headers

    def _signing_key(self, secret: str, day: str, region: str) -> bytes:
        cached = self._keys.get((secret, day, region))
        if cached is not None:
            return cached
        key = ("AWS4" + secret).encode()
        for part in (day, region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        with self._lock:
            if len(self._keys) > 8:
                self._keys.clear()
            self._keys[(secret, day, region)] = key
        return key


def reply_fields(headers: Mapping[str, str]) -> dict[str, Any]:
    """The reply's headers as boto3's GetObject names them (those the read path uses)."""
    fields: dict[str, Any] = {"ContentLength": int(headers.get("content-length", 0))}
    for header, name in (("etag", "ETag"), ("content-range", "ContentRange")):
        value = headers.get(header)
        if value is not None:
            fields[name] = value
    modified = headers.get("last-modified")
    if modified:
        try:
            fields["LastModified"] = _http_date(modified)
        except (TypeError, ValueError):
            pass
    return fields


_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {name: i for i, name in enumerate(_MONTH_NAMES, 1)}


def _http_date(value: str) -> datetime.datetime:
    """An HTTP date; the usual form ("Sat, 05 Dec 2026 09:22:25 GMT") without the ``email``
    package's general parser, which cost a tenth of a small object's reply."""
    parts = value.split()
    if len(parts) == 6 and parts[5] == "GMT" and parts[2] in _MONTHS:
        clock = parts[4].split(":")
        if len(clock) == 3:
            try:
                return datetime.datetime(
                    int(parts[3]),
                    _MONTHS[parts[2]],
                    int(parts[1]),
                    int(clock[0]),
                    int(clock[1]),
                    int(clock[2]),
                    tzinfo=datetime.timezone.utc,
                )
            except ValueError:
                pass
    return parsedate_to_datetime(value)


def _client_error(
    status: int, headers: Mapping[str, str], body: bytes
) -> botocore.exceptions.ClientError:
    code, message = str(status), ""
    try:
        root = ElementTree.fromstring(body) if body else None
    except ElementTree.ParseError:
        root = None
    if root is not None:
        code = root.findtext("Code") or code
        message = root.findtext("Message") or ""
    elif status == 404:
        code = "NoSuchKey"
    elif status == 412:
        code = "PreconditionFailed"
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": dict(headers)},
    }
    return botocore.exceptions.ClientError(response, "GetObject")
