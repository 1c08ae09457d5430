"""Which user owns the client end of a loopback TCP connection, as the kernel says (sock_diag,
the netlink interface `ss` reads): a local user may connect from any loopback address
(127.0.0.2, 127.0.0.3, ...), so over loopback the address names no one, and the uid does."""

from __future__ import annotations

import ipaddress
import socket
import struct

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_UID_AT = _HEADER.size + 4 + 48 + 12  # inet_diag_msg: family..retrans, its sockid, 3 counters


def is_loopback(host: str) -> bool:
    """Whether `host` names this node's loopback (a host name may resolve to anything)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_uid(sock: socket.socket) -> int | None:
    """The uid owning the other end of `sock`, an accepted TCP connection from a loopback
    address; None where the kernel does not say (the client gone already)."""
    family = sock.family
    peer, local = sock.getpeername(), sock.getsockname()

    def packed(host: str) -> bytes:
        raw = socket.inet_pton(family, host)
        return raw + bytes(16 - len(raw))
    # The client's socket: its source is our peer, its destination is us.
    sockid = (struct.pack("!HH", peer[1], local[1]) + packed(peer[0]) + packed(local[0])
              + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as netlink:
        netlink.sendto(_HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                    _NLM_F_REQUEST, 1, 0) + request, (0, 0))
        reply = netlink.recv(1024)
    _, kind, _, _, _ = _HEADER.unpack_from(reply)
    if kind != _SOCK_DIAG_BY_FAMILY or len(reply) < _UID_AT + 4:
        return None  # NLMSG_ERROR: no such socket
    return struct.unpack_from("=I", reply, _UID_AT)[0]
