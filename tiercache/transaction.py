"""``TransactionFile``: a file written inside ``with fs.transaction:``, committed at its end.

fsspec opens files with ``autocommit=False`` inside a transaction, and at the end of the
block calls ``commit()`` on each (or ``discard()`` if the block raised). The bytes are staged
in the tier as for any write; ``close()`` only ends the writing, and the staged file is handed
to its committer (write-behind or write-through, as configured) by ``commit()``. Until then
nothing reaches the store, the tier's entries or the journal, so a discarded file, or one whose
process dies before the end of the block, leaves nothing behind (``reconcile`` removes the
staged file of a writer that is gone and never closed it).
"""

from __future__ import annotations

import io
from types import TracebackType
from typing import Any

from tiercache.write.staged import StagedWriteFile


class TransactionFile(io.RawIOBase):
    """A staged write whose commit waits for the end of the filesystem's transaction."""

    def __init__(self, staged: StagedWriteFile) -> None:
        super().__init__()
        self._staged = staged
        self.path = staged.path
        self.name = staged.name
        self.mode = staged.mode
        self.committed = False

    def __repr__(self) -> str:
        return f"<TransactionFile {self.path!r} committed={self.committed}>"

    @property
    def info(self) -> dict[str, Any] | None:
        """What the committer recorded, once committed (as ``StagedWriteFile.info``)."""
        return self._staged.info

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._staged.tell()

    def fileno(self) -> int:
        self._checkClosed()
        return self._staged.fileno()

    def write(self, data: Any) -> int:
        self._checkClosed()
        return self._staged.write(data)

    def close(self) -> None:
        """End the writing; the staged bytes wait for ``commit()`` or ``discard()``."""
        super().close()

    def commit(self) -> None:
        """Hand the staged bytes to their committer (called at the end of the transaction)."""
        super().close()
        if not self._staged.closed:
            self._staged.close()
            self.committed = True

    def discard(self) -> None:
        """Drop the staged bytes (the transaction's block raised, or this file's did)."""
        super().close()
        self._staged.discard()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.discard()  # a half-written file is not committed with the others
        else:
            self.close()
