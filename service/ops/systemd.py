"""Tells systemd how the daemon is doing (a `Type=notify` unit), by the datagram protocol of
sd_notify(3): one message to the socket named by $NOTIFY_SOCKET. Without it, nothing happens."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(*fields: str) -> bool:
    """Sends `fields` (e.g. "READY=1", "STATUS=...") to systemd; whether one was listening."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall("\n".join(fields).encode())
    except OSError as e:
        log.warning("cannot notify systemd at %s: %s", os.environ["NOTIFY_SOCKET"], e)
        return False
    return True
