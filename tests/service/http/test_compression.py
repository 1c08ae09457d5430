"""Compressed REST bodies inflated a piece at a time (service/http/compression.py): each piece
charged to the caller before the next is inflated, so that a caller's share of the bodies
arriving bounds what inflating holds too."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest
from aiohttp import web

from service.http.compression import inflated


def test_every_inflated_byte_is_charged_a_piece_at_a_time() -> None:
    body = bytes(range(256)) * (12 << 10)  # 3 MiB: several pieces
    charges: list[int] = []
    for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        charges.clear()
        assert asyncio.run(inflated(packed, encoding, len(body), "", charges.append)) == body
        assert sum(charges) == len(body) and len(charges) >= 3 and max(charges) <= 1 << 20


def test_a_refused_charge_stops_the_inflating() -> None:
    charges: list[int] = []

    def charge(nbytes: int) -> None:
        if sum(charges) + nbytes > 2 << 20:
            raise web.HTTPTooManyRequests(reason="over the caller's share")
        charges.append(nbytes)
    with pytest.raises(web.HTTPTooManyRequests):
        asyncio.run(inflated(gzip.compress(bytes(64 << 20)), "gzip", 1 << 30, "", charge))
    assert sum(charges) <= 2 << 20  # 64 MiB were never held
