"""The write-ahead spool: batches ClickHouse could not take yet, on local disk, in order.

Each batch is one Arrow IPC file named ``<sequence>-<dedup token>-<rows>.arrow``, written to
a temporary name, fsync'd, renamed and the directory fsync'd before ``append`` returns, so a
batch the collector acknowledged survives a crash. Replays insert with the batch's original
token, so a replay that already reached ClickHouse before a crash stores nothing twice.
The spool is bounded by bytes; ``append`` answers False instead of growing past it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{20})-([0-9a-f]{32})-(\d+)\.arrow$")


class SpoolError(Exception):
    """The spool cannot be used: a batch cannot be read back, or another process holds it."""


@dataclass(frozen=True, order=True)
class SpoolEntry:
    seq: int
    token: str
    rows: int
    path: Path
    size: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """A bounded, ordered, crash-safe queue of Arrow batches in one directory.

    >>> spool = Spool(Path("/tmp/latscope-spool-doc"), max_bytes=1 << 30)  # doctest: +SKIP
    >>> spool.append("0" * 32, table)  # doctest: +SKIP
    True
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        # One process per spool: two collectors replaying the same files would race.
        self._lockfile = open(directory / ".lock", "a")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lockfile.close()
            raise SpoolError(
                f"spool {directory} is in use by another collector; give each its own --spool-dir"
            ) from None
        self._lock = threading.Lock()
        # A temporary file was never renamed, so its batch was never acknowledged: drop it.
        for stale in directory.glob("*.tmp"):
            stale.unlink(missing_ok=True)
        self._entries: list[SpoolEntry] = []
        for path in directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                self._entries.append(
                    SpoolEntry(
                        int(match.group(1)),
                        match.group(2),
                        int(match.group(3)),
                        path,
                        path.stat().st_size,
                    )
                )
        self._entries.sort()
        self._next = self._entries[-1].seq + 1 if self._entries else 0
        self.bytes = sum(e.size for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[SpoolEntry]:
        """Spooled batches, oldest first."""
        with self._lock:
            return list(self._entries)

    def append(self, token: str, table: pa.Table) -> bool:
        """Write a batch durably; False when the spool has no room for it."""
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        data = sink.getvalue()
        with self._lock:
            if self.bytes + data.size > self.max_bytes:
                return False
            seq = self._next
            self._next += 1
            path = self.directory / f"{seq:020d}-{token}-{table.num_rows}.arrow"
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(path)
            _fsync_dir(self.directory)
            self._entries.append(SpoolEntry(seq, token, table.num_rows, path, data.size))
            self.bytes += data.size
        return True

    def close(self) -> None:
        """Release the spool for another process (or a restarted collector)."""
        self._lockfile.close()

    def read(self, entry: SpoolEntry) -> pa.Table:
        try:
            with ipc.open_stream(pa.memory_map(str(entry.path))) as reader:
                return reader.read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise SpoolError(f"cannot read spooled batch {entry.path}: {exc}") from exc

    def remove(self, entry: SpoolEntry) -> None:
        """Forget a batch once it is in ClickHouse."""
        with self._lock:
            entry.path.unlink(missing_ok=True)
            self._entries.remove(entry)
            self.bytes -= entry.size

    def quarantine(self, entry: SpoolEntry) -> Path:
        """Move an unreadable or unstorable batch aside (kept for a human, never replayed)."""
        target = entry.path.with_suffix(".bad")
        with self._lock:
            entry.path.rename(target)
            self._entries.remove(entry)
            self.bytes -= entry.size
        return target
