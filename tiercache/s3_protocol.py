"""fsspec's ``s3`` and ``s3a`` protocols: s3fs's class when it imports, else a URL-only stand-in.

fsspec resolves every hop of a chained URL to its class before anything is opened, but of the
``s3`` hop in ``tiercache::s3://bucket/key`` it only calls ``_strip_protocol`` and
``_get_kwargs_from_urls``: tiercache does the S3 I/O itself, with boto3. fsspec maps ``s3`` to
s3fs, which would make s3fs (and aiobotocore, whose pins on botocore trail boto3's releases)
a dependency for two class methods. tiercache's ``fsspec.specs`` entry points map ``s3`` and
``s3a`` to ``S3FileSystem`` here instead: it *is* ``s3fs.S3FileSystem`` wherever s3fs imports,
so s3fs's users see no change; without s3fs it is ``S3UrlStandIn``, which parses the URL as
s3fs does and, instantiated for I/O, raises fsspec's own ``ImportError`` ("Install s3fs").
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from fsspec import AbstractFileSystem


class S3UrlStandIn(AbstractFileSystem):  # type: ignore[misc]
    """The ``s3`` hop of a chained URL where s3fs is not installed: URL parsing, no I/O.

    ``_strip_protocol`` is fsspec's, as s3fs's is (``s3://b/k/`` → ``b/k``);
    ``_get_kwargs_from_urls`` is s3fs's, so a ``?versionId=`` asks for ``version_aware`` here
    too (which tiercache refuses: it does not read object versions).
    """

    protocol = ("s3", "s3a")
    root_marker = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        error = _S3FS if isinstance(_S3FS, ImportError) else None
        if isinstance(error, ModuleNotFoundError) and error.name == "s3fs":
            reason = "Install s3fs to access S3"
        else:
            reason = f"s3fs is installed but does not import ({error}); it is needed to access S3"
        raise ImportError(
            f"{reason}: without it, s3:// URLs resolve only as the store behind tiercache "
            "(tiercache::s3://bucket/key)"
        ) from error

    @staticmethod
    def _get_kwargs_from_urls(urlpath: str) -> dict[str, Any]:
        if "versionId" in parse_qs(urlsplit(urlpath).query):
            return {"version_aware": True}
        return {}


def _import_s3fs() -> type[Any] | ImportError:
    try:
        from s3fs import S3FileSystem as S3fsFileSystem  # noqa: PLC0415
    except ImportError as error:  # absent, or installed against a botocore it does not match
        return error
    return S3fsFileSystem  # type: ignore[no-any-return]


_S3FS = _import_s3fs()
S3FileSystem: type[Any] = S3UrlStandIn if isinstance(_S3FS, ImportError) else _S3FS
