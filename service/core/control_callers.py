"""Who may load and unload models (RepositoryModelLoad / Unload), decided from what a transport
knows of a caller: the uid the kernel names on the unix socket, and whether it sent the admin
token. A rule of the core, so that every transport applies the same one."""

from __future__ import annotations

import os

from service.errors import PermissionDeniedError


def check_caller(uid: int | None, admin: bool, admin_configured: bool) -> None:
    """Lets root and the daemon's own user over the unix socket (`uid` as the kernel names it;
    None over TCP) and holders of the admin token (`admin`) load and unload models."""
    if admin or uid in (0, os.getuid()):
        return
    raise PermissionDeniedError(
        "loading and unloading models is for root and the daemon's user over the unix socket, "
        "and for holders of the admin token (metadata 'authorization: Bearer <token>'" + (
            ")" if admin_configured else "; this daemon has none: --admin-token-file)"))
