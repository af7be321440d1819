"""S3 endpoint URLs: where requests go, no credentials in them, and one canonical spelling.

The canonical form names a store in cache entry ids and write-behind journal records, so two
spellings of one endpoint (``http://localhost:8333``, ``HTTP://127.0.0.1:8333/``) share a cache
and each other's pending uploads. It is computed without DNS: a name's addresses change.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from tiercache.errors import ConfigError

# The namespace of a store with no endpoint: AWS, wherever boto3's region sends requests.
AWS_NAMESPACE = "s3:aws"

# boto3 reads these when no endpoint is passed, the service-specific one first.
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


def check_endpoint(url: object, label: str = "endpoint") -> str:
    """Return ``url`` if it is an http(s) URL with a host, a numeric port if any, no userinfo,
    no query and no fragment; else raise ``ConfigError``.

    ``label`` names where the URL came from (``s3 endpoint_url``, ``AWS_ENDPOINT_URL``). The
    message shows the URL only as ``redact_endpoint`` writes it: what precedes an ``@`` may be
    an access key and its secret, and a port that is not a number, a query or a fragment may
    be a secret pasted in the wrong place (boto3 refuses such an endpoint and repeats it whole).
    """
    if not isinstance(url, str):
        raise ConfigError(f"{label} must be an http:// or https:// URL, got {type(url).__name__}")
    if "@" in url:
        raise ConfigError(
            f"{label}: userinfo (user:password@) is not allowed in an endpoint, got "
            f"{redact_endpoint(url)!r}; pass the access key and secret as the s3 options key "
            "and secret (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    if "?" in url or "#" in url:
        raise ConfigError(
            f"{label}: a query or fragment (?…, #…) is not allowed in an endpoint, got "
            f"{redact_endpoint(url)!r}"
        )
    _canonical(url, label)
    return url


def redact_endpoint(url: str) -> str:
    """``url`` as messages may show it: userinfo, the query and the fragment each replaced by
    ``***``, and so is a port that is not a number with all that follows it; the scheme, host
    and path are kept, to find the setting."""
    scheme, sep, rest = url.partition("://")
    if not (sep and _SCHEME_RE.match(scheme)):
        scheme, rest = "", url
    at = "@" in rest
    rest = rest.rpartition("@")[2]
    authority, path = _split_at(rest, "/?#")
    path, query = _split_at(path, "?#")
    host, colon, port = authority.rpartition(":") if _has_port(authority) else (authority, "", "")
    if colon and not port.isdigit():  # a secret there may run on past a "/" as well
        port, path, query = "***", "", ""
    query = query[:1] + "***" if query else ""
    redacted = f"{'***@' if at else ''}{host}{colon}{port}{path}{query}"
    return f"{scheme}://{redacted}" if scheme else redacted


def _split_at(text: str, delimiters: str) -> tuple[str, str]:
    """``text`` cut before the first of ``delimiters`` (the second part empty if none)."""
    cut = min((i for i in map(text.find, delimiters) if i >= 0), default=len(text))
    return text[:cut], text[cut:]


def _has_port(authority: str) -> bool:
    """Whether ``authority`` ends in ``:port`` (an IPv6 literal's colons are in brackets)."""
    return ":" in authority.rpartition("]")[2]


def configured_endpoint(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """The endpoint requests go to: ``explicit``, else boto3's environment variables (checked
    like an explicit one); None: AWS."""
    if explicit is not None:
        return check_endpoint(explicit, "s3 endpoint_url")
    if environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").strip().lower() == "true":
        return None
    for name in ENDPOINT_VARIABLES:
        if environ.get(name):
            return check_endpoint(environ[name], name)
    return None


def canonical_endpoint(url: str) -> str:
    """One spelling per endpoint: ``scheme://host:port[/path]``.

    Scheme and host lowercased, a host's trailing dot dropped, ``localhost`` spelled
    ``127.0.0.1``, IP literals in ``ipaddress``'s compressed form (IPv6 in brackets), the
    default port made explicit, trailing slashes of the path dropped. DNS names are not
    resolved. A URL ``check_endpoint`` refuses raises ``ConfigError``.
    """
    return _canonical(check_endpoint(url), "endpoint")


def canonical_namespace(namespace: str) -> str:
    """The canonical form of a stored ``s3:<url>`` namespace; others are returned unchanged.

    Old journal records and entries hold the raw spelling; compare ``canonical_namespace`` of
    both sides. Userinfo in an old record is dropped, and a URL that does not parse is kept.
    """
    scheme, sep, url = namespace.partition(":")
    if scheme != "s3" or not sep or namespace == AWS_NAMESPACE:
        return namespace
    if "@" in url:
        prefix, has_scheme, _ = url.partition("://")
        if not has_scheme:
            return namespace
        url = f"{prefix}://{url.rpartition('@')[2]}"
    try:
        return "s3:" + _canonical(url, "endpoint")
    except ConfigError:
        return namespace


def store_label(namespace: str) -> str:
    """A store as users name it, for messages: the endpoint URL of an ``s3:<url>`` namespace,
    ``AWS S3`` for ``s3:aws``; another namespace as it is."""
    if namespace == AWS_NAMESPACE:
        return "AWS S3"
    scheme, sep, url = namespace.partition(":")
    return url if scheme == "s3" and sep and url else namespace


def _canonical(url: str, label: str) -> str:
    """The canonical form of a URL known to have no userinfo."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        parts = None  # raised below, outside this block: the ValueError repeats the port
    if parts is None:
        raise ConfigError(f"{label} has an invalid host or port: {redact_endpoint(url)!r}")
    if parts.scheme not in _DEFAULT_PORTS:
        raise ConfigError(
            f"{label} must start with http:// or https://, got {redact_endpoint(url)!r}"
        )
    host = (parts.hostname or "").removesuffix(".")
    if not host:
        raise ConfigError(f"{label} has no host: {redact_endpoint(url)!r}")
    if host in _LOOPBACK_NAMES:
        host = "127.0.0.1"
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            pass  # a DNS name: kept as written (lowercased)
        else:
            host = f"[{address.compressed}]" if address.version == 6 else address.compressed
    if port is None:
        port = _DEFAULT_PORTS[parts.scheme]
    return f"{parts.scheme}://{host}:{port}{parts.path.rstrip('/')}"
