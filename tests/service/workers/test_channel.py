"""The channel between a front-end and the device owner: the messages of one event-loop
iteration travel as one frame with their payloads, and a frame that does not decode closes the
channel instead of raising in the owner."""

from __future__ import annotations

import asyncio
import socket

from service.workers import messages as msg
from service.workers.owner_channel import Channel

PLACE = ("image", "<f4", (1, 1, 28, 28), 0, 3136)


async def _pair(kind: type, received: list) -> tuple[Channel, Channel]:
    here, there = socket.socketpair()
    sender = await Channel.open(here, msg.ToOwner, lambda m, p: None)
    receiver = await Channel.open(there, kind, lambda m, p: received.append((m, bytes(p))))
    return sender, receiver


def test_one_iteration_s_messages_arrive_in_order_with_their_payloads() -> None:
    async def main():
        received: list = []
        frames: list[int] = []
        sender, receiver = await _pair(msg.ToFrontend, received)
        feed = receiver.data_received
        receiver.data_received = lambda data: (frames.append(len(data)), feed(data))
        sender.send(msg.Reply(1, "cpu0", [("logits", "<f4", (1, 10), 40)], 0.5, "model", 10, []),
                    b"a" * 40)
        sender.send(msg.Done(2))
        sender.send(msg.Statistics(3, []), b"stats")
        while len(received) < 3:
            await asyncio.sleep(0.01)
        sender.close()
        receiver.close()
        return received, frames
    received, frames = asyncio.run(main())
    assert [type(m) for m, _ in received] == [msg.Reply, msg.Done, msg.Statistics]
    assert [p for _, p in received] == [b"a" * 40, b"", b"stats"]
    assert len(frames) == 1  # one write, one wake-up


def test_a_frame_that_does_not_decode_closes_the_channel() -> None:
    async def main():
        received: list = []
        here, there = socket.socketpair()
        receiver = await Channel.open(there, msg.ToOwner, lambda m, p: received.append(m))
        here.sendall(b"\x05\x00\x00\x00\x00\x00\x00\x00" + b"\xc1\xc1\xc1\xc1\xc1")
        await asyncio.wait_for(receiver.closed.wait(), 10)
        here.close()
        return received
    assert asyncio.run(main()) == []
