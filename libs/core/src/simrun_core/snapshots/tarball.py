"""The upload's tar: regular members named by the SHA-256 of their content, written by clients, checked here."""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from simrun_core.errors import InvalidArgument

BLOCK = 512
CHUNK_BYTES = 1 << 20
_READ_BYTES = 1 << 20

Opener = Callable[[], BinaryIO]


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def tar_size(sizes: Iterable[int]) -> int:
    """Bytes of the tar `iter_tar` writes for contents of these sizes: a header and padded data each, two end blocks."""
    return sum(BLOCK + _padded(size) for size in sizes) + 2 * BLOCK


def _header(sha256: str, size: int) -> bytes:
    info = tarfile.TarInfo(sha256)
    info.size = size
    info.mode = 0o444
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")


def iter_tar(members: Iterable[tuple[str, int, Opener]], chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Yields a tar of `(sha256, size, open)` members in chunks of about `chunk_bytes`.

    A content that is shorter or longer than announced (changed since it was hashed) raises `InvalidArgument`
    before the rest is sent; one of the same size but another content is refused by the service.
    """
    buffer = bytearray()
    for sha256, size, opener in members:
        buffer += _header(sha256, size)
        left = size
        with opener() as f:
            while left:
                block = f.read(min(left, _READ_BYTES))
                if not block:
                    raise InvalidArgument(f"content {sha256} became shorter while it was sent: snapshot again")
                left -= len(block)
                buffer += block
                if len(buffer) >= chunk_bytes:
                    yield bytes(buffer)
                    buffer.clear()
            if f.read(1):
                raise InvalidArgument(f"content {sha256} became longer while it was sent: snapshot again")
        buffer += bytes(_padded(size) - size)
        if len(buffer) >= chunk_bytes:
            yield bytes(buffer)
            buffer.clear()
    buffer += bytes(2 * BLOCK)
    yield bytes(buffer)


class _Announced:
    """A file-like view of the chunks that refuses more bytes than the upload announced."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._chunks = iter(chunks)
        self._limit = limit
        self._buffer = bytearray()
        self._pos = 0
        self.received = 0

    def _pull(self) -> bool:
        chunk = next(self._chunks, None)
        if chunk is None:
            return False
        self.received += len(chunk)
        if self.received > self._limit:
            raise InvalidArgument(f"the upload sent more bytes than the {self._limit} its header announced")
        if self._pos:
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += chunk
        return True

    def read(self, size: int = -1) -> bytes:
        while (size < 0 or len(self._buffer) - self._pos < size) and self._pull():
            pass
        end = len(self._buffer) if size < 0 else min(len(self._buffer), self._pos + size)
        data = bytes(self._buffer[self._pos : end])
        self._pos = end
        return data

    def drain(self) -> None:
        while self._pull():
            self._buffer.clear()


def drain(chunks: Iterable[bytes], size: int) -> None:
    """Reads and drops an upload's tar that is not needed, still refusing more bytes than announced."""
    _Announced(chunks, size).drain()


def receive_contents(chunks: Iterable[bytes], size: int, announced: dict[str, int], stage: Path) -> set[str]:
    """Extracts a streamed tar into `stage/<sha256>` and returns the hashes received.

    Args:
        chunks: the tar's bytes, in pieces.
        size: the tar's size in bytes as the header announced it.
        announced: the size of each regular content the upload announced, by SHA-256.
        stage: an empty folder on the store's file system.

    Raises:
        InvalidArgument: a member that is not a regular file (device, link, folder, …), not named by an announced
            hash, larger than announced or whose content has another hash; a tar longer or shorter than announced.
    """
    if size < 0:
        raise InvalidArgument(f"negative tar_size {size}")
    source = _Announced(chunks, size)
    received: set[str] = set()
    if size == 0:
        source.drain()
        return received
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                _receive_member(tar, member, announced, received, stage)
    except tarfile.TarError as exc:
        raise InvalidArgument(f"the upload is not a valid tar: {exc}") from exc
    source.drain()
    if source.received != size:
        raise InvalidArgument(f"the upload sent {source.received} bytes, its header announced {size}")
    return received


def _receive_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, announced: dict[str, int], received: set[str], stage: Path
) -> None:
    name = member.name
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        kind = {
            tarfile.LNKTYPE: "a hard link",
            tarfile.SYMTYPE: "a symlink",
            tarfile.CHRTYPE: "a character device",
            tarfile.BLKTYPE: "a block device",
            tarfile.FIFOTYPE: "a fifo",
            tarfile.DIRTYPE: "a folder",
        }.get(member.type, f"of type {member.type!r}")
        raise InvalidArgument(f"tar member {name!r} is {kind}: the upload holds regular files only")
    if name not in announced:
        raise InvalidArgument(f"tar member {name!r} is not named by the sha256 of an announced content")
    if name in received:
        raise InvalidArgument(f"tar member {name!r} is sent twice")
    if member.size != announced[name]:
        raise InvalidArgument(f"tar member {name} holds {member.size} bytes, {announced[name]} were announced")
    data = tar.extractfile(member)
    if data is None:  # pragma: no cover - regular members always have data
        raise InvalidArgument(f"tar member {name!r} has no data")
    digest = hashlib.sha256()
    target = stage / name
    with open(target, "xb") as out:
        while block := data.read(_READ_BYTES):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != name:
        raise InvalidArgument(f"tar member {name} has content with sha256 {digest.hexdigest()}: it does not match")
    received.add(name)
