"""Endpoints: credentials in their URL are refused unseen, and each has one canonical namespace."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiercache import TierCacheFileSystem
from tiercache.config_file import load_config, store_options
from tiercache.errors import ConfigError
from tiercache.store.endpoint import redact_endpoint
from tiercache.store.s3 import S3Store
from tiercache.store.s3_options import S3Options, canonical_endpoint, canonical_namespace

KEY = "AKIAENDPOINTKEY0042"
SECRET = "wJalrXUtnFEMI-endpoint-s3cr3t"

_ENDPOINT_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
)


@pytest.fixture(autouse=True)
def _no_endpoint_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# -- credentials in an endpoint URL ------------------------------------------------------------


def _with_userinfo(secret: str = SECRET, host: str = "127.0.0.1:8333") -> str:
    return f"http://{KEY}:{secret}@{host}"


def _option(url: str, _: Any, __: Path) -> object:
    return S3Options(endpoint_url=url)


def _storage_option(url: str, _: Any, __: Path) -> object:
    return S3Options.from_storage_options({"endpoint_url": url})


def _s3fs_alias(url: str, _: Any, __: Path) -> object:
    return S3Options.from_storage_options({"endpoint": url})


def _client_kwargs(url: str, _: Any, __: Path) -> object:
    return S3Options.from_storage_options({"client_kwargs": {"endpoint_url": url}})


def _environment(name: str) -> Callable[[str, pytest.MonkeyPatch, Path], object]:
    def build(url: str, monkeypatch: pytest.MonkeyPatch, _: Path) -> object:
        monkeypatch.setenv(name, url)
        return S3Store(S3Options(region="us-east-1"))

    return build


def _filesystem(url: str, _: Any, tmp_path: Path) -> object:
    return TierCacheFileSystem(
        target_options={"endpoint_url": url}, local_dir=str(tmp_path), skip_instance_cache=True
    )


def _config_file(url: str, _: Any, tmp_path: Path) -> object:
    path = tmp_path / "config.toml"
    path.write_text(f'[s3]\nendpoint_url = "{url}"\n')
    return S3Options.from_storage_options(store_options(load_config(str(path), {}), {}, {}))


SOURCES = {
    "endpoint_url": _option,
    "storage_options": _storage_option,
    "s3fs_endpoint_alias": _s3fs_alias,
    "client_kwargs": _client_kwargs,
    "AWS_ENDPOINT_URL": _environment("AWS_ENDPOINT_URL"),
    "AWS_ENDPOINT_URL_S3": _environment("AWS_ENDPOINT_URL_S3"),
    "filesystem": _filesystem,
    "config_file": _config_file,
}


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize(
    "url",
    [
        _with_userinfo(),
        _with_userinfo(secret="pa@ss/wo#rd?" + SECRET),  # unescaped delimiters in the secret
        f"https://{KEY}:{SECRET}@s3.example.com/prefix",
        f"http://{KEY}@127.0.0.1:8333",  # a user name alone is still a credential
        f"{KEY}:{SECRET}@127.0.0.1:8333",  # no scheme
    ],
)
def test_userinfo_in_an_endpoint_is_refused_without_showing_it(
    source: str,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as caught:
        SOURCES[source](url, monkeypatch, tmp_path)
    exc = caught.value
    message = str(exc)
    assert "userinfo" in message and "not allowed in an endpoint" in message
    assert "key and secret" in message  # says how to pass them instead
    for shown in (message, repr(exc), repr(exc.args), caplog.text):
        assert KEY not in shown and SECRET not in shown and "pa@ss" not in shown
    assert exc.__cause__ is None and exc.__context__ is None


def test_the_refusal_names_where_the_endpoint_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="s3 endpoint_url"):
        S3Options(endpoint_url=_with_userinfo())
    monkeypatch.setenv("AWS_ENDPOINT_URL", _with_userinfo())
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL") as caught:
        S3Store()
    assert "http://***@127.0.0.1:8333" in str(caught.value)  # the host, to find the setting


def test_canonical_endpoint_refuses_userinfo_too() -> None:
    with pytest.raises(ConfigError) as caught:
        canonical_endpoint(_with_userinfo())
    assert SECRET not in repr(caught.value) and KEY not in repr(caught.value)


# -- a secret pasted into the wrong part of an endpoint -----------------------------------------

# Endpoints no S3 client can use (boto3 refuses a query or fragment and repeats the URL whole, in
# its error and its DEBUG log), each with the secret where a port, query or fragment would be.
MALFORMED = [
    f"http://127.0.0.1:{SECRET}/",
    f"http://127.0.0.1:{SECRET}",
    f"https://s3.example.com:{SECRET}/prefix/{SECRET}",
    f"http://[::1]:{SECRET}/",
    f"http://127.0.0.1:8333/?secret={SECRET}",
    f"http://127.0.0.1:8333?X-Amz-Signature={SECRET}#top",
    f"http://127.0.0.1:8333/#{SECRET}",
    f"ftp://s3.example.com:{SECRET}",
    f"http://:{SECRET}",
    f"127.0.0.1:{SECRET}",
]


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_endpoint_is_refused_without_showing_the_secret(
    source: str,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as caught:
        SOURCES[source](url, monkeypatch, tmp_path)
    exc = caught.value
    for shown in (str(exc), repr(exc), repr(exc.args), caplog.text):
        assert SECRET not in shown
    assert exc.__cause__ is None and exc.__context__ is None  # the ValueError repeats the port
    assert "***" in str(exc) or "http:// or https://" in str(exc)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"http://127.0.0.1:{SECRET}/a?b", "http://127.0.0.1:***"),
        ("http://[::1]:8333/p?q=1#f", "http://[::1]:8333/p?***"),
        ("https://s3.example.com/p#f", "https://s3.example.com/p#***"),
        (f"http://{KEY}:{SECRET}@127.0.0.1:8333/p", "http://***@127.0.0.1:8333/p"),
        ("http://127.0.0.1:8333/prefix", "http://127.0.0.1:8333/prefix"),
        (f"127.0.0.1:{SECRET}", "127.0.0.1:***"),
    ],
)
def test_redacted_endpoints_keep_what_finds_the_setting(url: str, shown: str) -> None:
    assert redact_endpoint(url) == shown


# -- the canonical endpoint --------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "http://localhost:8333",
        "http://127.0.0.1:8333",
        "http://127.0.0.1:8333/",
        "HTTP://LOCALHOST:8333",
        "http://localhost.:8333",
        "http://localhost.localdomain:8333",
        "http://LocalHost.LocalDomain.:8333//",
    ],
)
def test_spellings_of_one_endpoint_share_a_namespace(spelling: str) -> None:
    assert canonical_endpoint(spelling) == "http://127.0.0.1:8333"
    assert S3Store(S3Options(endpoint_url=spelling)).namespace == "s3:http://127.0.0.1:8333"


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        # scheme and host lowercased; a DNS name kept as a name
        ("HTTPS://S3.Example.COM:9000", "https://s3.example.com:9000"),
        # the host's trailing dot dropped
        ("https://s3.example.com.:9000", "https://s3.example.com:9000"),
        # the default port made explicit
        ("http://s3.example.com", "http://s3.example.com:80"),
        ("https://s3.example.com", "https://s3.example.com:443"),
        ("http://10.1.2.3/", "http://10.1.2.3:80"),
        # IP literals in their compressed form, IPv6 in brackets
        ("http://[::1]:8333", "http://[::1]:8333"),
        ("http://[0:0:0:0:0:0:0:1]:8333/", "http://[::1]:8333"),
        ("https://[2001:DB8:0:0::0:1]", "https://[2001:db8::1]:443"),
        # a path is kept (its case too), its trailing slashes are not
        ("https://s3.example.com/Prefix/", "https://s3.example.com:443/Prefix"),
        ("https://s3.example.com/a/b//", "https://s3.example.com:443/a/b"),
    ],
)
def test_canonical_endpoint_rules(url: str, canonical: str) -> None:
    assert canonical_endpoint(url) == canonical
    assert canonical_endpoint(canonical) == canonical  # idempotent


def test_a_path_keeps_endpoints_apart() -> None:
    assert canonical_endpoint("https://host/prefix") != canonical_endpoint("https://host")
    assert canonical_endpoint("https://host/a") != canonical_endpoint("https://host/b")


def test_ports_and_schemes_keep_endpoints_apart() -> None:
    assert canonical_endpoint("http://host") != canonical_endpoint("https://host")
    assert canonical_endpoint("http://host:9000") != canonical_endpoint("http://host:9001")
    assert canonical_endpoint("http://host:443") != canonical_endpoint("https://host")


def test_loopback_names_are_ipv4_and_ipv6_stays_apart() -> None:
    assert canonical_endpoint("http://localhost:1") == "http://127.0.0.1:1"
    assert canonical_endpoint("http://[::1]:1") == "http://[::1]:1"


def test_dns_names_are_not_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError("canonical_endpoint must not resolve names")

    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        monkeypatch.setattr(socket, name, refuse)
    assert canonical_endpoint("http://MinIO.internal:9000") == "http://minio.internal:9000"
    assert canonical_endpoint("http://localhost:9000") == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("localhost:9000", "http:// or https://"),
        ("ftp://host", "http:// or https://"),
        ("http://", "no host"),
        ("http://:9000", "no host"),
        ("http://host:99999", "invalid host or port"),
        ("http://host:port", "invalid host or port"),
    ],
)
def test_bad_endpoints_are_config_errors(url: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        canonical_endpoint(url)
    with pytest.raises(ConfigError, match="endpoint_url"):
        S3Options(endpoint_url=url)


def test_uppercase_schemes_are_accepted_as_options() -> None:
    assert S3Options(endpoint_url="HTTPS://s3.example.com").endpoint_url == "HTTPS://s3.example.com"


# -- canonical namespaces of stored records ----------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "canonical"),
    [
        ("s3:http://localhost:8333", "s3:http://127.0.0.1:8333"),
        ("s3:HTTP://LOCALHOST:8333/", "s3:http://127.0.0.1:8333"),
        ("s3:http://127.0.0.1:8333", "s3:http://127.0.0.1:8333"),
        ("s3:https://s3.example.com/prefix/", "s3:https://s3.example.com:443/prefix"),
        ("s3:http://[0::1]:9000", "s3:http://[::1]:9000"),
        # an old record's userinfo is dropped, not repeated
        (f"s3:http://{KEY}:{SECRET}@localhost:8333", "s3:http://127.0.0.1:8333"),
        # no endpoint (AWS), other stores and what does not parse: unchanged
        ("s3:aws", "s3:aws"),
        ("memory:140234", "memory:140234"),
        ("memory:http://localhost:1", "memory:http://localhost:1"),
        ("s3:not a url", "s3:not a url"),
        ("s3:http://host:99999", "s3:http://host:99999"),
        ("", ""),
    ],
)
def test_canonical_namespace(stored: str, canonical: str) -> None:
    assert canonical_namespace(stored) == canonical
    assert canonical_namespace(canonical) == canonical


def test_stored_and_live_namespaces_compare_canonically() -> None:
    store = S3Store(S3Options(endpoint_url="http://127.0.0.1:8333/"))
    assert canonical_namespace("s3:http://localhost:8333") == store.namespace
    assert canonical_namespace(store.namespace) == store.namespace


# -- the store -----------------------------------------------------------------------------------


def test_no_endpoint_is_aws() -> None:
    store = S3Store(S3Options(region="us-east-1"))
    assert (store.namespace, store.endpoint) == ("s3:aws", "aws")


def test_environment_endpoints_in_boto3s_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://LOCALHOST:9000")
    assert S3Store().namespace == "s3:http://127.0.0.1:9000"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")
    assert S3Store().namespace == "s3:http://s3-only:9000"
    explicit = S3Store(S3Options(endpoint_url="http://explicit:1"))
    assert explicit.namespace == "s3:http://explicit:1"
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert S3Store().namespace == "s3:aws"


def test_requests_go_to_the_endpoint_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The canonical form names the store; requests keep the configured spelling (the Host
    header and a server listening only on ::1 for ``localhost`` depend on it)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://localhost:8333")
    store = S3Store(S3Options(region="us-east-1", key="k", secret="s"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://elsewhere:1")  # resolved once, at creation
    assert store.endpoint == "http://localhost:8333"
    assert store.client().meta.endpoint_url == "http://localhost:8333"
    assert store.namespace == "s3:http://127.0.0.1:8333"


def test_the_store_never_shows_credentials() -> None:
    store = S3Store(
        S3Options(endpoint_url="http://localhost:8333", key=KEY, secret=SECRET, region="r")
    )
    for shown in (store.endpoint, store.namespace, repr(store), repr(store.options)):
        assert KEY not in shown and SECRET not in shown


def test_the_config_file_never_shows_endpoint_credentials(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'[s3]\nendpoint_url = "{_with_userinfo()}"\n')
    shown = repr(load_config(str(path), {}).public())
    assert KEY not in shown and SECRET not in shown and "127.0.0.1:8333" in shown
