"""Renaming a directory of the mount: copy every object under it, then delete the originals.

Object stores have no directories to rename, so a directory's objects are copied one by one
(``fs.cp_file``: a server-side copy, or a local one for a write not uploaded yet) and only
when all of them are copied are the originals deleted. A copy that fails deletes the copies
made so far and leaves the directory as it was; a delete that fails leaves both trees whole.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("tiercache.mount")


class TreeMoveError(OSError):
    """A directory could not be renamed (the log says which object and why)."""


def objects_under(fs: Any, full: str) -> list[str]:
    """Every object under the directory ``full`` (``bucket/prefix``), writes pending included."""
    base = full.rstrip("/") + "/"
    names: list[str] = fs.find(full, detail=False)
    return [str(name) for name in names if str(name).startswith(base) and str(name) != base]


def move_tree(fs: Any, old_full: str, new_full: str, names: list[str]) -> None:
    """Copy each of ``names`` (under ``old_full``) to ``new_full``, then delete them."""
    copied: list[str] = []
    for name in names:
        target = new_full + name[len(old_full) :]
        try:
            fs.cp_file(name, target)
        except Exception as exc:
            log.error(
                "renaming %s to %s: copying %s failed (%s); removing the %d copies made, "
                "nothing was moved",
                old_full,
                new_full,
                name,
                exc,
                len(copied),
            )
            _remove(fs, copied)
            raise TreeMoveError(5, f"copying {name} failed: {exc}") from exc
        copied.append(target)
    try:
        if names:
            fs.rm(names)
    except Exception as exc:
        log.error(
            "renaming %s to %s: everything was copied, but deleting the originals failed "
            "(%s): both names now hold the files",
            old_full,
            new_full,
            exc,
        )
        raise TreeMoveError(5, f"deleting the originals failed: {exc}") from exc


def _remove(fs: Any, names: list[str]) -> None:
    if not names:
        return
    try:
        fs.rm(names)
    except Exception as exc:
        log.error("could not remove the partial copies %s: %s", names, exc)
