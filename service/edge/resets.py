"""HTTP/2 rapid reset (CVE-2023-44487) stopped at the door: a connection that resets streams
faster than the server completes them gets GOAWAY (ENHANCE_YOUR_CALM) and is closed. grpc core
(1.85) sends no GOAWAY for it, whatever its arguments; its stream cap alone only keeps such a
connection from taking other clients' streams, not the CPU it burns.

The door reads no payload: it walks each direction's frames by their 9-byte headers, counting the
client's RST_STREAM frames and the streams the server ends (END_STREAM), and knowing where the
server's frames end so that its GOAWAY never lands inside one. TLS connections pass through
undecrypted and are not watched (grpc core's stream cap still holds them)."""

from __future__ import annotations

import struct

_PREFACE = len(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the client's, before its first frame
_HEADER = 9
DATA, HEADERS, RST_STREAM, GOAWAY = 0x0, 0x1, 0x3, 0x7
END_STREAM = 0x1
ENHANCE_YOUR_CALM = 0xB


class FrameWalk:
    """One direction of a connection, frame by frame: the type, flags, stream and payload
    length of each frame header as it completes, whatever the chunks it arrives in."""

    def __init__(self, skip: int = 0) -> None:
        self._skip = skip  # bytes of a payload (or the preface) still to pass
        self._partial = b""  # a header cut by the end of a chunk

    @property
    def between_frames(self) -> bool:
        return not self._skip and not self._partial

    def frames(self, data: bytes) -> list[tuple[int, int, int, int]]:
        found = []
        at, end = 0, len(data)
        while at < end:
            if self._skip:
                step = min(self._skip, end - at)
                self._skip -= step
                at += step
                continue
            need = _HEADER - len(self._partial)
            header, self._partial = self._partial + data[at:at + need], b""
            at += need
            if len(header) < _HEADER:
                self._partial = header
                break
            length, kind, flags, stream = struct.unpack(">I", b"\0" + header[:3])[0], \
                header[3], header[4], struct.unpack(">I", header[5:])[0] & 0x7FFFFFFF
            found.append((kind, flags, stream, length))
            self._skip = length
        return found


class ResetWatch:
    """Counts a connection's stream resets against the streams the server completed; more than
    `allowance` ahead is rapid reset."""

    def __init__(self, allowance: int) -> None:
        self._allowance = allowance
        self._client, self._server = FrameWalk(skip=_PREFACE), FrameWalk()
        self.resets = self.completed = self.last_stream = 0

    def from_client(self, data: bytes) -> list[tuple[int, int, int, int]]:
        """Counts what the client sends; its frames (type, flags, stream, length)."""
        frames = self._client.frames(data)
        for kind, _, stream, _ in frames:
            if kind == RST_STREAM:
                self.resets += 1
            elif kind == HEADERS:
                self.last_stream = max(self.last_stream, stream)
        return frames

    @property
    def over(self) -> bool:
        """Whether the client has reset more streams than its allowance."""
        return self.resets > self.completed + self._allowance

    def from_server(self, data: bytes) -> None:
        for kind, flags, _, _ in self._server.frames(data):
            if kind in (DATA, HEADERS) and flags & END_STREAM:
                self.completed += 1

    def reset_refusal(self) -> str:
        return (f"{self.resets} streams reset against {self.completed} completed, more than "
                f"--max-stream-resets {self._allowance} ahead")

    def goaway(self, reason: str) -> bytes | None:
        """The GOAWAY frame to end the connection with, `reason` its debug data; None while a
        server frame is half sent (the connection is then just closed)."""
        if not self._server.between_frames:
            return None
        debug = reason.encode()
        payload = struct.pack(">II", self.last_stream, ENHANCE_YOUR_CALM) + debug
        return struct.pack(">I", len(payload))[1:] + bytes([GOAWAY, 0]) + \
            struct.pack(">I", 0) + payload
