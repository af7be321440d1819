"""``scripts/remote_store.py``: the proxy that paces a loopback server like a far store."""

from __future__ import annotations

from support.scripts import load

remote_store = load("remote_store")
ConnectionServer = remote_store.ConnectionServer
PROFILES = remote_store.PROFILES
RemoteStore = remote_store.RemoteStore
parse_rate = remote_store.parse_rate
spawn = remote_store.spawn

__all__ = ["PROFILES", "ConnectionServer", "RemoteStore", "parse_rate", "remote_store", "spawn"]
