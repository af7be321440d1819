"""Connection options of the S3 store, parsed from s3fs-style ``s3={...}`` storage options."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tiercache.config import accepted_options
from tiercache.errors import ConfigError
from tiercache.store.endpoint import canonical_endpoint, canonical_namespace, check_endpoint

__all__ = [
    "STORE_OPTION_NAMES",
    "AddressingStyle",
    "S3Options",
    "canonical_endpoint",
    "canonical_namespace",
]

AddressingStyle = Literal["auto", "path", "virtual"]

# s3fs option names accepted for compatibility of chained URLs, mapped to ours.
_ALIASES = {
    "endpoint": "endpoint_url",
    "aws_access_key_id": "key",
    "aws_secret_access_key": "secret",
    "aws_session_token": "token",
    "region_name": "region",
    "use_ssl": None,  # implied by the endpoint URL's scheme
    "default_block_size": None,  # fsspec buffering knobs: tiercache has its own
    "default_fill_cache": None,
    "default_cache_type": None,
}
# s3fs options that change what is stored or who pays: ignoring them would be silent harm.
_UNSUPPORTED = {
    "s3_additional_kwargs": "extra request arguments (encryption, ACLs) are not sent",
    "requester_pays": "requester-pays buckets are not supported",
    "version_aware": "object versions are not read",
}
_NESTED = ("client_kwargs", "config_kwargs")


@dataclass(frozen=True, kw_only=True)
class S3Options:
    """Where the store is and how to authenticate; secrets never appear in ``repr``.

    ``endpoint_url`` may not carry userinfo (``http://KEY:SECRET@host``): it would end up in
    messages, cache metadata and the journal; the key and secret are options of their own.

    Unset values fall back to boto3's own chain (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_PROFILE``, ``~/.aws/config`` …).

    Attributes:
        endpoint_url: URL of the S3 endpoint (``https://s3.example.com``), without
            credentials in it; unset: boto3's (``AWS_ENDPOINT_URL``, else AWS).
        key: access key id; given together with ``secret``.
        secret: secret access key; never printed, logged or stored by tiercache.
        token: session token of temporary credentials.
        profile: a profile of ``~/.aws/config`` and ``~/.aws/credentials`` to take the
            credentials (and region) from.
        region: the store's region (Ceph RGW and some other stores want one set).
        addressing_style: ``auto``, ``path`` (``endpoint/bucket/key``, what most stores
            other than AWS want) or ``virtual`` (``bucket.endpoint/key``).
        anon: send requests unsigned (public buckets).
        verify: TLS verification: False to turn it off, or the path of a CA bundle.
    """

    endpoint_url: str | None = None
    key: str | None = dataclasses.field(default=None, repr=False)
    secret: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)
    profile: str | None = None
    region: str | None = None
    addressing_style: AddressingStyle = "auto"
    anon: bool = False
    verify: bool | str | None = None

    def __post_init__(self) -> None:
        if self.endpoint_url is not None:
            check_endpoint(self.endpoint_url, "s3 endpoint_url")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"s3 addressing_style must be auto, path or virtual, got {self.addressing_style!r}"
            )
        if (self.key is None) != (self.secret is None):
            raise ConfigError("s3 key and secret must be given together")

    @classmethod
    def from_storage_options(cls, options: Mapping[str, Any]) -> S3Options:
        """Accept s3fs's names (``key``, ``secret``, ``client_kwargs``, ``config_kwargs``).

        Other keys are ignored as ``TierCacheConfig.from_options`` ignores them (a likely
        typo with a ``UserWarning``). A filesystem's ``target_options`` handed down one level
        too far, as a client rebuilding a chained URL does, give the options not set here.
        """
        options = _lift_target_options(options)
        flat: dict[str, Any] = {}
        for name, value in accepted_options(options, _ACCEPTED, "s3").items():
            if name in _UNSUPPORTED:
                raise ConfigError(f"s3 option {name} is not supported: {_UNSUPPORTED[name]}")
            if name == "client_kwargs":
                flat.update(_from_client_kwargs(value))
            elif name == "config_kwargs":
                flat.update(_from_config_kwargs(value))
            elif name in _ALIASES:
                if _ALIASES[name] is not None:
                    flat[str(_ALIASES[name])] = value
            else:
                flat[name] = value
        return cls(**flat)


# The names that configure the store (what a caller means to reach it), and all it accepts.
STORE_OPTION_NAMES = frozenset(
    {f.name for f in dataclasses.fields(S3Options)}
    | {alias for alias, name in _ALIASES.items() if name is not None}
    | set(_NESTED)
)
_ACCEPTED = STORE_OPTION_NAMES | set(_ALIASES) | set(_UNSUPPORTED)


def _lift_target_options(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` with a nested ``target_options`` (for s3) merged under its own keys."""
    nested = options.get("target_options")
    if not isinstance(nested, Mapping) or options.get("target_protocol") not in (None, "s3", "s3a"):
        return options
    return {**_lift_target_options(nested), **options}


def _from_client_kwargs(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError("s3 client_kwargs must be a mapping")
    out: dict[str, Any] = {}
    for name, item in value.items():
        target = {
            "endpoint_url": "endpoint_url",
            "region_name": "region",
            "aws_access_key_id": "key",
            "aws_secret_access_key": "secret",
            "aws_session_token": "token",
            "verify": "verify",
        }.get(name)
        if target is None:
            raise ConfigError(f"unsupported s3 client_kwargs entry: {name}")
        out[target] = item
    return out


def _from_config_kwargs(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError("s3 config_kwargs must be a mapping")
    out: dict[str, Any] = {}
    for name, item in value.items():
        if name == "s3" and isinstance(item, Mapping) and set(item) <= {"addressing_style"}:
            if "addressing_style" in item:
                out["addressing_style"] = item["addressing_style"]
        else:
            raise ConfigError(
                f"unsupported s3 config_kwargs entry: {name} (timeouts and retries are "
                "tiercache options: connect_timeout, read_timeout, retries)"
            )
    return out
