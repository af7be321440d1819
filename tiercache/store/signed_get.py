"""``SignedGet``: GetObject signed here and sent through botocore's own HTTP session.

A GetObject through a boto3 client costs about 1 ms of client CPU before the first byte:
parameter validation, endpoint rules, a dozen events, the user agent, the signer, a parser that
reads every header (and a date parser for Last-Modified). For an object of 128 KiB that is more
than reading and caching its bytes, and a dataset of loose files pays it per file. A GET needs
little of it: this module signs the request (SigV4, the one HMAC chain per day and region
cached) and sends it through the connection pool of the client's own ``http_session``, so
TLS verification, timeouts and the connections are botocore's (a proxy sends every request
through boto3).

What the client resolved is learnt, not re-implemented: the URL of a bucket (addressing style,
regional host, custom endpoint) and the signing region come from one presigned URL per bucket,
and the credentials from the client's signer, refreshed as botocore refreshes them. A reply
other than 200/206 is read for its S3 error code and mapped by the same rules as a boto3
error. A redirect or an authorization error the client itself would not get (a bucket in
another region, a request this module signed wrongly) makes the caller repeat the request
through boto3 and stop using this path for the bucket.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit
from xml.etree import ElementTree

import botocore.awsrequest
import botocore.exceptions

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_PROBE_KEY = "tiercache-probe"
_POOLS_KEPT = 10  # botocore's pool manager keeps 10 hosts' pools (urllib3's default)
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
        self._session = client._endpoint.http_session
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[str, str, str] | None] = {}  # url prefix, host, region
        self._keys: dict[tuple[str, str, str], bytes] = {}  # (secret, day, region) -> key
        self._pools: dict[str, Any] = {}  # url prefix -> the session's urllib3 pool for it

    @classmethod
    def for_client(cls, client: Any, anonymous: bool) -> SignedGet | None:
        """The signed-GET path for ``client``, or None where it cannot stand in for boto3
        (a proxy configured, no credentials to sign with, an unfamiliar botocore)."""
        if any(os.environ.get(name) for name in _PROXY_VARIABLES):
            return None
        if getattr(client.meta.config, "proxies", None):
            return None
        try:
            signed = cls(client, anonymous)
        except AttributeError:
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

    def get(self, bucket: str, key: str, headers: Mapping[str, str]) -> Any:
        """Send the GET; the reply's urllib3 response (200 or 206, body unread).

        Raises ``StoreRefusedError`` for an error reply, ``LookupError`` for one the caller
        should repeat through boto3 (the bucket is then refused), and botocore's transport
        errors as botocore raises them.
        """
        with self._lock:
            target = self._buckets.get(bucket)
        if target is None:
            raise LookupError(bucket)
        prefix, host, region = target
        url = prefix + quote(key, safe="/~")
        target_path = urlsplit(url).path
        signed: Any = self._sign(host, target_path, region, headers)
        raw = self._send(prefix, url, target_path, signed)
        status = int(raw.status)
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

    def _send(self, prefix: str, url: str, target_path: str, headers: Any) -> Any:
        """The GET's urllib3 response (body unread), from the connection pool of the client's
        HTTP session for the bucket's host.

        The pool is asked of the session once per host and kept (for as many hosts as the
        session keeps pools): the session's own ``send`` looked up proxies, parsed the URL,
        found the pool and copied the reply's headers for every object, which cost a tenth of
        a small object's client CPU. A pool closed since is asked for again. Transport errors are
        urllib3's, which the store classifies as it does botocore's (retried).
        """
        pool = self._pools.get(prefix)
        if pool is None or pool.pool is None:
            if len(self._pools) >= _POOLS_KEPT:
                self._pools.clear()  # as many hosts as the session keeps pools for
            try:
                manager = self._session._get_connection_manager(url, None)
                pool = manager.connection_from_url(url)
                self._session._setup_ssl_cert(pool, url, self._session._verify)
            except AttributeError:  # an unfamiliar botocore: its own send does it all
                request = botocore.awsrequest.AWSPreparedRequest(
                    method="GET", url=url, headers=headers, body=None, stream_output=True
                )
                return self._session.send(request).raw
            self._pools[prefix] = pool
        return pool.urlopen(
            "GET",
            target_path,
            body=None,
            headers=headers,
            retries=False,
            assert_same_host=False,
            preload_content=False,
            decode_content=False,
            enforce_content_length=False,
        )

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
            fields["LastModified"] = parsedate_to_datetime(modified)
        except (TypeError, ValueError):
            pass
    return fields


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
