"""Request bodies a client compressed (`Content-Encoding: gzip` or `deflate`, as tritonclient.http
sends them with `request_compression_algorithm`), inflated off the event loop a piece at a time,
each piece charged to the caller's share of the bodies arriving, and never beyond what the request
may hold. aiohttp inflated them on the loop, in full: a 58 KB gzip body that expands to 60 MB held
every other caller's requests for 0.1-0.2 s, and a body that was not gzip at all answered 500."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

from aiohttp import web

from service.errors import InvalidInputError

IDENTITY = "identity"
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}  # deflate: zlib's format
ENCODINGS = (IDENTITY, *_WBITS)
_PIECE = 1 << 20  # inflated per turn in a thread; zlib drops the GIL meanwhile


async def inflated(body: bytes, encoding: str, most: int, bound: str,
                   charge: Callable[[int], None]) -> bytes:
    """`body` as it was before its `encoding`, at most `most` bytes (`bound` says what sets it,
    in the refusal: 413). `charge(n)` holds n more inflated bytes for the caller, or raises.
    Another encoding is refused 415, data that is not in its encoding 400."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise web.HTTPUnsupportedMediaType(
            reason=f"header 'Content-Encoding': {encoding[:40]!r} received, expected one of "
                   f"{', '.join(ENCODINGS)}")
    inflater = zlib.decompressobj(wbits)
    pieces: list[bytes] = []
    size, data = 0, body
    while True:
        try:
            piece = await asyncio.to_thread(inflater.decompress, data, _PIECE)
        except zlib.error as e:
            raise InvalidInputError(f"header 'Content-Encoding': {encoding}, but the body is "
                                    f"not {encoding} data ({e})") from None
        size += len(piece)
        if size > most:
            raise web.HTTPRequestEntityTooLarge(
                max_size=most, actual_size=size,
                reason=f"the body inflates ({encoding}) to more than {most} bytes, {bound}")
        charge(len(piece))
        pieces.append(piece)
        data = inflater.unconsumed_tail
        if inflater.eof or not (data or piece):
            break
    if not inflater.eof:
        raise InvalidInputError(f"header 'Content-Encoding': {encoding}, but the body ends "
                                f"before its {encoding} data does")
    if inflater.unused_data:
        raise InvalidInputError(f"header 'Content-Encoding': {encoding}, but "
                                f"{len(inflater.unused_data)} bytes follow its {encoding} data")
    return b"".join(pieces)
