"""The write-ahead spool: batches not yet in ClickHouse, on local disk, in order.

Two kinds of entry share one sequence:

* an Arrow IPC file ``<sequence>-<dedup token>-<rows>.arrow`` holds one batch ClickHouse could
  not take (written to a temporary name, fsync'd, renamed and the directory fsync'd before
  ``append`` returns);
* a journal segment ``<sequence>-<dedup token>.otlp`` holds serialized OTLP trace Exports,
  appended and fsync'd before each is acknowledged (``Segment``); a closed segment becomes one
  ClickHouse insert. A torn record at its end (a crash mid-write, never acknowledged) is ignored.

Replays insert with the entry's original token, so a replay that already reached ClickHouse
before a crash stores nothing twice. The spool is bounded by bytes; ``append`` answers False
instead of growing past it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.ipc as ipc

from latscope.collector.mapping import DECODED_SPANS_SCHEMA, Limits, MalformedExport, decode_spans

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{20})-([0-9a-f]{32})-(\d+)\.arrow$")
_SEGMENT = re.compile(r"^(\d{20})-([0-9a-f]{32})\.otlp$")
#: First line of a journal segment; the second is its limits as JSON, then the records.
_MAGIC = b"latscope otlp-traces journal 1\n"
_LOCK = ".lock"
#: Rows ClickHouse refused alone (``quarantine_rows``), in this folder of the spool directory.
QUARANTINE = "quarantine"


class SpoolError(Exception):
    """The spool cannot be used: a batch cannot be read back, or another process holds it."""


@dataclass(frozen=True, order=True)
class SpoolEntry:
    seq: int
    token: str
    #: -1 for a journal segment found at start: its rows are known once it is read
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
        self._lockfile = self._take(directory)
        self._lock = threading.Lock()
        # A temporary file was never renamed, so its batch was never acknowledged: drop it.
        for stale in directory.glob("*.tmp"):
            stale.unlink(missing_ok=True)
        self._entries: list[SpoolEntry] = []
        for path in directory.iterdir():
            match = _NAME.match(path.name)
            segment = _SEGMENT.match(path.name)
            if match:
                seq, token, rows = int(match.group(1)), match.group(2), int(match.group(3))
            elif segment:
                seq, token, rows = int(segment.group(1)), segment.group(2), -1
            else:
                continue
            self._entries.append(SpoolEntry(seq, token, rows, path, path.stat().st_size))
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

    def open_segment(self, limits: Limits) -> Segment:
        """Start a journal segment; it joins ``entries()`` once closed."""
        with self._lock:
            seq = self._next
            self._next += 1
        return Segment(self, seq, uuid.uuid4().hex, limits)

    def _grow(self, size: int) -> bool:
        with self._lock:
            if self.bytes + size > self.max_bytes:
                return False
            self.bytes += size
            return True

    def _shrink(self, size: int) -> None:
        with self._lock:
            self.bytes -= size

    def _add(self, entry: SpoolEntry) -> None:
        with self._lock:
            self._entries.append(entry)
            self._entries.sort()

    @staticmethod
    def _take(directory: Path) -> IO[str]:
        """The spool's lock file, locked: one process per spool (two collectors replaying the
        same files would race)."""
        while True:
            directory.mkdir(parents=True, exist_ok=True)
            lockfile = open(directory / _LOCK, "a")  # noqa: SIM115 (held until close)
            try:
                fcntl.flock(lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lockfile.close()
                raise SpoolError(
                    f"spool {directory} is in use by another collector; give each its own "
                    "--spool-dir"
                ) from None
            # close() removes an empty spool's lock file while holding the lock: a lock taken on
            # a file that was removed meanwhile locks nothing, so take the new one instead.
            try:
                if os.stat(directory / _LOCK).st_ino == os.fstat(lockfile.fileno()).st_ino:
                    return lockfile
            except FileNotFoundError:
                pass
            lockfile.close()

    def close(self) -> None:
        """Release the spool for another process (or a restarted collector).

        An empty spool leaves nothing behind: its lock file and directory are removed (still
        under the lock), so short-lived processes (tests, demos) do not litter the disk.
        """
        with self._lock:
            empty = not self._entries and not any(p.name != _LOCK for p in self.directory.iterdir())
        if empty:
            with contextlib.suppress(OSError):
                (self.directory / _LOCK).unlink()
                self.directory.rmdir()
        self._lockfile.close()

    def read(self, entry: SpoolEntry) -> pa.Table:
        if entry.path.suffix == ".otlp":
            return read_segment(entry.path)
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

    def set_aside(self, entry: SpoolEntry) -> None:
        """Take an inserted batch out of the queue but keep its file (and its bytes) until
        ``discard``: ClickHouse has the rows, not yet on disk for sure. A restart before then
        replays the file, and its token makes ClickHouse store nothing twice."""
        with self._lock:
            self._entries.remove(entry)

    def discard(self, entries: list[SpoolEntry]) -> None:
        """Remove set-aside batches for good (their rows are on ClickHouse's disk)."""
        with self._lock:
            for entry in entries:
                entry.path.unlink(missing_ok=True)
                self.bytes -= entry.size

    def quarantine_rows(self, table: str, token: str, rows: pa.Table, reason: str) -> Path:
        """Keep rows ClickHouse refused, with the reason, in ``quarantine/`` beside the batches:
        ``<token>.arrow`` (the rows, as inserted into ``table``) and ``<token>.json``. The name
        is the token of the insert that was refused, so a replay that is refused again writes
        the same files. ``latscope quarantine`` lists them and inserts them again."""
        folder = self.directory / QUARANTINE
        folder.mkdir(exist_ok=True)
        path = folder / f"{token}.arrow"
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        note = {"table": table, "rows": rows.num_rows, "reason": reason, "token": token,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        for target, data in ((path, sink.getvalue().to_pybytes()),
                             (path.with_suffix(".json"), json.dumps(note).encode())):  # fmt: skip
            tmp = target.with_name(target.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(target)
        _fsync_dir(folder)
        return path

    def quarantine(self, entry: SpoolEntry) -> Path:
        """Move an unreadable or unstorable batch aside (kept for a human, never replayed)."""
        target = entry.path.with_suffix(".bad")
        with self._lock:
            entry.path.rename(target)
            self._entries.remove(entry)
            self.bytes -= entry.size
        return target


class Segment:
    """A journal segment being written: each ``append`` is durable (fsync'd) when it returns.

    Only the writer's journal thread appends; ``close`` hands the segment to the spool's
    entries, where it waits for its insert (or a replay).
    """

    def __init__(self, spool: Spool, seq: int, token: str, limits: Limits) -> None:
        self.spool = spool
        self.seq = seq
        self.token = token
        self.path = spool.directory / f"{seq:020d}-{token}.otlp"
        # The limits the Exports were checked against: a replay maps them the same way even if
        # the collector restarts with other settings.
        self._header = (
            _MAGIC
            + json.dumps(
                {"max_attributes": limits.max_attributes,
                 "max_attribute_value": limits.max_attribute_value}
            ).encode()
            + b"\n"
        )  # fmt: skip
        self._fd: int | None = None
        self.size = 0
        self.rows = 0

    def append(self, records: list[bytes], rows: int) -> bool:
        """Write serialized Exports durably; False (nothing written) when the spool is full."""
        parts = [] if self._fd is not None else [self._header]
        for record in records:
            parts.append(len(record).to_bytes(4, "little"))
            parts.append(record)
        size = sum(len(part) for part in parts)
        if not self.spool._grow(size):
            return False
        first = self._fd is None
        try:
            if first:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                _fsync_dir(self.spool.directory)  # the name must survive a crash as the data does
            assert self._fd is not None
            _write_all(self._fd, parts)
            os.fdatasync(self._fd)
        except OSError:
            self.spool._shrink(size)
            if first and self._fd is not None:
                # Never leave a segment without its header: the next append starts afresh.
                os.close(self._fd)
                self._fd = None
                self.path.unlink(missing_ok=True)
            elif self._fd is not None:
                # Cut a partial record off, so later records stay readable.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self.size)
            raise
        self.size += size
        self.rows += rows
        return True

    def close(self) -> SpoolEntry | None:
        """No more appends; the entry to insert (None when nothing was written)."""
        if self._fd is None:
            return None
        os.close(self._fd)
        self._fd = None
        entry = SpoolEntry(self.seq, self.token, self.rows, self.path, self.size)
        self.spool._add(entry)
        return entry


#: Buffers one ``writev`` takes at most (Linux's IOV_MAX).
_IOV_MAX = 1024


def _write_all(fd: int, parts: list[bytes]) -> None:
    """Write ``parts`` one after the other, without joining them into one more copy first (the
    Exports' bytes are counted against the memory limit once, as received)."""
    views = [memoryview(part) for part in parts if part]
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + _IOV_MAX])
        while first < len(views) and written >= len(views[first]):
            written -= len(views[first])
            first += 1
        if written:
            views[first] = views[first][written:]


def read_segment(path: Path) -> pa.Table:
    """A journal segment's Exports as one spans table (a torn last record is left out)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpoolError(f"cannot read journal segment {path}: {exc}") from exc
    if not data.startswith(_MAGIC):
        raise SpoolError(f"{path} is not a journal segment")
    end = data.find(b"\n", len(_MAGIC))
    try:
        limits = Limits(**json.loads(data[len(_MAGIC) : end]))
    except (ValueError, TypeError) as exc:
        raise SpoolError(f"{path}: unreadable header: {exc}") from exc
    tables = []
    pos = end + 1
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "little")
        if pos + 4 + size > len(data):
            break  # torn: written when the process died, so never acknowledged
        try:
            decoded = decode_spans(data[pos + 4 : pos + 4 + size], limits)
        except MalformedExport as exc:
            raise SpoolError(f"{path}: record at byte {pos} is not an Export: {exc}") from exc
        tables.append(decoded.table)
        pos += 4 + size
    return pa.concat_tables(tables) if tables else DECODED_SPANS_SCHEMA.empty_table()
