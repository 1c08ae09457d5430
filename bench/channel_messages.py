"""The cost of one message between a front-end process and the device owner: the typed
messages of service/workers/messages.py (msgspec, MessagePack arrays) against the JSON
dictionaries the channel carried before, in the same run. Each figure is building a request's
message, encoding it and decoding it on the other side.

    .venv/bin/python -m bench.channel_messages [--number 200000]
"""

from __future__ import annotations

import argparse
import json
import timeit

import msgspec

from service.workers import messages as msg

PLACES = [("image", "<f4", (1, 1, 28, 28), 4096, 3136)]


def typed() -> None:
    data = _encode(msg.Infer(12345, "mnist_cnn", 1, 1, 1, PLACES, 0, 0, None, "uid 1000", False))
    _decode(data)


def as_json() -> None:  # the reference: what the channel sent before
    data = json.dumps({"op": "infer", "id": 12345, "model": "mnist_cnn", "version": "1",
                       "inputs": [list(p) for p in PLACES], "priority": 0, "timeout_us": 0,
                       "deadline": None}, separators=(",", ":")).encode()
    json.loads(data)


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(msg.ToOwner).decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=200_000, help="messages per timing")
    args = parser.parse_args()
    best = {name: min(timeit.repeat(f, number=args.number, repeat=5)) / args.number
            for name, f in (("JSON dictionary", as_json), ("typed (msgspec)", typed))}
    for name, seconds in best.items():
        print(f"{name}: {seconds * 1e6:.2f} µs per message")
    print(f"typed / JSON: {best['typed (msgspec)'] / best['JSON dictionary']:.2f}x")


if __name__ == "__main__":
    main()
