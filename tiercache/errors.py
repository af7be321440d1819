"""The exception tree of tiercache.

Every error tiercache raises derives from ``TierCacheError``; concrete errors also derive from
the matching built-in so that callers' ``except FileNotFoundError`` clauses keep working::

    TierCacheError(Exception)
    ├── ConfigError(ValueError)              an option has a bad value; the message names it
    │   ├── UnknownOptionError(TypeError)    a keyword is no option, and close to one's name
    │   └── TierDirError(OSError)            a tier's directory cannot be made or used
    ├── ObjectNotFoundError(FileNotFoundError)   no such bucket or key
    ├── AccessDeniedError(PermissionError)   the store refused the credentials or the action
    ├── StoreError(OSError)                  the store answered with an error we do not retry
    │   ├── StoreUnavailableError(ConnectionError)  retries spent: unreachable, 5xx, throttled
    │   ├── NotImplementedByStoreError       501: the store lacks what was asked (conditions)
    │   └── ObjectChangedError               the object changed while it was being fetched, or
    │                                        a conditional write found another version
    ├── CacheTimeoutError(TimeoutError)      waited too long for another fetcher
    ├── CacheCorruptError(OSError)           a cache entry failed its integrity check
    ├── UploadFailedError(OSError)           written behind, but refused by the store for good
    │                                        or lost; ``pending()`` keeps reporting it
    └── TierFullError(OSError)               the tier's filesystem is out of space (ENOSPC)

Messages name the bucket/key, the endpoint and the operation, never credentials.
"""

from __future__ import annotations

import errno


class TierCacheError(Exception):
    """Base of every error raised by tiercache."""


class ConfigError(TierCacheError, ValueError):
    """An option has a bad value; the message names the option."""


class UnknownOptionError(ConfigError, TypeError):
    """A keyword argument is no option, and so close to an option's name that it is taken for
    a typo of it (as Python answers an unexpected keyword); the message names both."""


class TierDirError(OSError, ConfigError):
    """A tier's directory (``local_dir``, ``shared_dir``) cannot be made or used; the message
    names the option, the path and what is in the way. ``errno`` and ``filename`` are those
    of the failed call."""

    def __str__(self) -> str:
        return str(self.strerror)


class ObjectNotFoundError(TierCacheError, FileNotFoundError):
    """The bucket or the key does not exist in the store."""


class AccessDeniedError(TierCacheError, PermissionError):
    """The store refused the request (credentials or policy)."""


class StoreError(TierCacheError, OSError):
    """The store answered with an error that retrying will not fix."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached or kept failing after bounded retries."""


class NotImplementedByStoreError(StoreError):
    """The store does not implement what the request asked (501 NotImplemented), such as the
    conditional headers of a write on a store without conditional writes."""


class ObjectChangedError(StoreError):
    """The object's ETag changed while tiercache was fetching it."""


class CacheTimeoutError(TierCacheError, TimeoutError):
    """Waited longer than allowed for a fetch held by another thread or process."""


class CacheCorruptError(TierCacheError, OSError):
    """A cache entry failed its size or digest check (errno EIO, as a failed read reports it).

    Raised with a message alone; ``errno`` is then EIO and ``str()`` the message.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*((errno.EIO, *args) if len(args) == 1 else args))

    def __str__(self) -> str:
        return super().__str__() if self.strerror is None else str(self.strerror)


class UploadFailedError(TierCacheError, OSError):
    """Objects written behind that will not reach the store without the user's action: the
    store refused them for good (``failed``) or their bytes were lost (``lost``)."""

    def __init__(self, message: str, names: list[str]) -> None:
        super().__init__(5, message)  # EIO, as a failed write reports it
        self.names = names

    def __str__(self) -> str:
        return str(self.strerror)


class TierFullError(TierCacheError, OSError):
    """The tier's filesystem ran out of space (or quota); reads then bypass the tier."""


# The errnos that say a filesystem is out of space or quota: the one place they are listed.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_no_space(exc: BaseException) -> bool:
    """True if ``exc`` says the filesystem it came from is out of space (or quota)."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


def tier_full(exc: OSError, message: str, filename: str | None = None) -> OSError:
    """``exc`` as the documented ``TierFullError`` (its errno kept) if it says the tier is out
    of space or quota, ``message`` saying what could not be done; any other error, and a
    ``TierFullError`` already, unchanged."""
    if isinstance(exc, TierFullError) or not is_no_space(exc):
        return exc
    if filename is None:
        return TierFullError(exc.errno, message)
    return TierFullError(exc.errno, message, filename)
