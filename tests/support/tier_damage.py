"""Damage done to a tier behind tiercache's back: a flipped byte, a process that checked nothing."""

from __future__ import annotations

from typing import Any


def flip_byte(path: str, offset: int) -> None:
    """Invert the byte at ``offset`` of ``path`` in place (bit rot, a stray writer)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def forget_checks(fs: Any) -> None:
    """What a new process starts with: no cached file checked yet."""
    verifier = getattr(fs.read_path, "verifier", None)  # (none before verify="first")
    if verifier is not None:
        verifier.forget_all()
