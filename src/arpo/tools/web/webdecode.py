"""A response body decoded with a cap on the DECODED bytes: `browse`'s defence against compression bombs.

httpx decodes each received chunk whole (`zlib.decompress` without an output limit), so a 980-byte
body with `Content-Encoding: gzip, gzip` became 1 GB in memory before any size check could run.
Here every layer (any number of gzip / deflate layers, in the order the header lists them) is a
pull-based decompressor that never produces more than the bytes asked for (`decompressobj.decompress`'s
max_length), fed from the raw bytes as they arrive; reading stops at `max_bytes` of decoded output.
Memory: about max_bytes + 64 KiB per layer, whatever the compression ratio.

Other codings (br, zstd, compress, ...) are not asked for (`ACCEPT_ENCODING`) and are refused.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator

from arpo.tools.web.webhttp import WebError

ACCEPT_ENCODING = "gzip, deflate"
CHUNK = 64 * 1024
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def codings(content_encoding: str | None) -> list[str]:
    """The codings of a Content-Encoding header in the order they were applied ("identity" dropped).
    Raises WebError for one that cannot be decoded here."""
    out = [c.strip().lower() for c in (content_encoding or "").split(",")]
    out = [c for c in out if c and c != "identity"]
    bad = [c for c in out if c not in _WBITS]
    if bad:
        raise WebError(f"cannot decode Content-Encoding {', '.join(bad)} (only gzip and deflate)")
    return out


class _Raw:
    """The raw chunks as a reader: read(n) -> at most n bytes, b"" at the end."""

    def __init__(self, chunks: Iterable[bytes]):
        self._it: Iterator[bytes] = iter(chunks)
        self._buf = b""

    def read(self, n: int) -> bytes:
        while not self._buf:
            nxt = next(self._it, None)
            if nxt is None:
                return b""
            self._buf = bytes(nxt)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


class _Inflate:
    """One gzip or deflate layer over `source`: read(n) -> at most n decoded bytes, b"" at the end.
    Deflate accepts the zlib wrapper or raw deflate (as httpx does); gzip accepts several members."""

    def __init__(self, source, coding: str, deadline: float | None):
        self.source, self.coding, self.deadline = source, coding, deadline
        self._d = zlib.decompressobj(_WBITS[coding])
        self._pending = b""
        self._started = self._ended = False
        self._members = 0

    def read(self, n: int) -> bytes:
        while not self._ended:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise WebError("the page took too long to decode")
            if not self._pending:
                self._pending = self.source.read(CHUNK)
                if not self._pending:
                    return b""  # the input ended (a truncated stream ends here too)
            try:
                out = self._d.decompress(self._pending, n)
            except zlib.error as e:
                if self.coding == "deflate" and not self._started:  # raw deflate, no zlib wrapper
                    self._d, self._started = zlib.decompressobj(-zlib.MAX_WBITS), True
                    continue
                if self.coding != "deflate" and self._members and not self._started:
                    self._ended = True  # bytes after the last gzip member are ignored (as zlib does)
                    break
                raise WebError(f"bad {self.coding} data ({e})") from e
            self._started = True
            self._pending = self._d.unconsumed_tail
            if self._d.eof:
                if self.coding == "deflate":
                    self._ended = True  # whatever follows the stream is ignored
                else:  # another gzip member may follow
                    self._pending = self._d.unused_data + self._pending
                    self._d, self._started = zlib.decompressobj(_WBITS[self.coding]), False
                    self._members += 1
            if out:
                return out
        return b""


def read_decoded(raw_chunks: Iterable[bytes], content_encoding: str | None, max_bytes: int,
                 deadline: float | None = None) -> tuple[bytes, bool]:
    """(the body decoded, at most max_bytes of it; whether it was cut there). Raises WebError for an
    unknown coding, bad compressed data, or the time.monotonic() `deadline` passing."""
    reader: _Raw | _Inflate = _Raw(raw_chunks)
    for c in reversed(codings(content_encoding)):  # the last coding applied is undone first
        reader = _Inflate(reader, c, deadline)
    out = bytearray()
    while len(out) < max_bytes:
        piece = reader.read(min(CHUNK, max_bytes - len(out)))
        if not piece:
            return bytes(out), False
        out += piece
    return bytes(out), True
