"""Is FUSE usable here: the binding, the libfuse library, ``fusermount`` and ``/dev/fuse``."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = (
    "install FUSE: apt-get install fuse3 (Debian/Ubuntu) or dnf install fuse3 (Fedora), "
    "and the binding: pip install 'tiercache[mount]'"
)


@dataclass(frozen=True)
class FuseSupport:
    """What a mount needs, each with the problem that stops it (None: fine)."""

    binding: str | None
    library: str | None
    fusermount: str | None
    device: str | None

    @property
    def problems(self) -> list[str]:
        return [p for p in (self.binding, self.library, self.fusermount, self.device) if p]

    @property
    def usable(self) -> bool:
        return not self.problems


def built_libfuse() -> Path | None:
    """The libfuse >= 3.16 that ``scripts/build-libfuse.sh`` built into this environment, if
    any, and only for root: FUSE passthrough needs both, and the build's ``fusermount3``
    (which ``auto_unmount`` runs) is not setuid."""
    library = Path(sys.prefix) / "libfuse" / "lib" / "libfuse3.so.4"
    return library if os.geteuid() == 0 and library.exists() else None


def prefer_libfuse3() -> None:
    """Have mfusepy load libfuse 3 where it is installed (it picks libfuse 2 when both are),
    unless ``FUSE_LIBRARY_NAME`` or ``FUSE_LIBRARY_PATH`` says otherwise: libfuse 2 never
    passes on a change of the mtime alone (``touch -m``, ``tar -x``). A libfuse built into
    this environment (``built_libfuse``) comes first. Call before importing mfusepy."""
    if "FUSE_LIBRARY_NAME" in os.environ or "FUSE_LIBRARY_PATH" in os.environ:
        return
    built = built_libfuse()
    if built is not None:
        os.environ["FUSE_LIBRARY_PATH"] = str(built)
    elif ctypes.util.find_library("fuse3"):
        os.environ["FUSE_LIBRARY_NAME"] = "fuse3"


def fusermount_path() -> str | None:
    """The setuid helper libfuse mounts and unmounts with (``fusermount3`` for libfuse 3)."""
    return shutil.which("fusermount3") or shutil.which("fusermount")


def fuse_support() -> FuseSupport:
    """Check each piece without mounting anything."""
    library = None
    if not (ctypes.util.find_library("fuse3") or ctypes.util.find_library("fuse")):
        library = f"the libfuse library is not installed ({INSTALL_HINT})"
    binding = None
    if library is None:
        try:
            # Importing the binding loads libfuse, so it is tried only once the library exists.
            prefer_libfuse3()
            import mfusepy  # noqa: F401, PLC0415
        except ImportError:
            binding = "the FUSE binding mfusepy is not installed (pip install 'tiercache[mount]')"
        except (OSError, AttributeError) as exc:
            binding = f"the FUSE binding cannot load libfuse: {exc} ({INSTALL_HINT})"
    fusermount = None
    if fusermount_path() is None:
        fusermount = f"fusermount3 is not installed ({INSTALL_HINT})"
    device = None
    if not os.path.exists("/dev/fuse"):
        device = "/dev/fuse is missing (load the fuse module: modprobe fuse; in a container, "
        device += "pass --device /dev/fuse --cap-add SYS_ADMIN)"
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        device = "/dev/fuse is not readable and writable by this user (add it to group fuse)"
    return FuseSupport(binding, library, fusermount, device)
