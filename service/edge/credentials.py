"""Credentials that change under a running daemon. The bearer token and the TLS key pair are
re-read when their files change (an operator rewrites them, or Kubernetes swaps a mounted
secret's symbolic link), checked on use: the token on every call over TCP, the key pair on every
new connection. A changed file that cannot be used (unreadable, empty, a key that does not match
its certificate) is logged and the credentials in force stay, so a half-done rotation never locks
clients out."""

from __future__ import annotations

import hmac
import logging
import os
import ssl
from pathlib import Path

import grpc

from service.settings import Settings

log = logging.getLogger(__name__)


class ExposureError(Exception):
    """TCP would be reachable from other hosts without TLS and a token."""


def read_token(path: Path, setting: str = "--token-file") -> str:
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise ExposureError(f"{setting}: cannot read {str(path)!r}: {e.strerror}") from None
    if not token:
        raise ExposureError(f"{setting}: {str(path)!r} is empty; expected a bearer token")
    return token


class _Watched:
    """Whether files changed since the last look, by identity, size and modification time
    (following symbolic links, so a swapped secret counts)."""

    def __init__(self, *paths: Path) -> None:
        self._paths = paths
        self._seen = self._signature()

    def _signature(self) -> tuple:
        signature: list[tuple[int, int, int, int] | None] = []
        for path in self._paths:
            try:
                s = os.stat(path)
                signature.append((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns))
            except OSError:
                signature.append(None)
        return tuple(signature)

    def changed(self) -> bool:
        now = self._signature()
        changed, self._seen = now != self._seen, now
        return changed


class TokenFile:
    """The bearer token in force, from `path` (the file that `setting` names). Raises
    ExposureError at start-up if unusable."""

    def __init__(self, path: Path, setting: str = "--token-file") -> None:
        self._path, self._setting = path, setting
        self._watched = _Watched(path)
        self._bearer = f"Bearer {read_token(path, setting)}".encode()

    def bearer(self) -> bytes:
        """`Bearer <token>` as callers must send it, re-read first if the file changed."""
        if self._watched.changed():
            try:
                self._bearer = f"Bearer {read_token(self._path, self._setting)}".encode()
                log.info("%s %s changed: the new token is in force", self._setting, self._path)
            except ExposureError as e:
                log.warning("%s; the previous token stays in force", e)
        return self._bearer


class TlsFiles:
    """Server credentials for a certificate chain and its key that follow the files. Raises
    ExposureError at start-up if the pair cannot be used."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._cert, self._key = cert, key
        self._watched = _Watched(cert, key)
        self._initial = self._load()

    def credentials(self) -> grpc.ServerCredentials:
        # gRPC calls the fetcher before each new connection's handshake.
        return grpc.dynamic_ssl_server_credentials(self._initial, self._fetch)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        if not self._watched.changed():
            return None
        try:
            configuration = self._load()
        except ExposureError as e:
            log.warning("%s; the previous certificate stays in force", e)
            return None
        log.info("tls_cert %s changed: new connections get the new certificate", self._cert)
        return configuration

    def _load(self) -> grpc.ServerCertificateConfiguration:
        try:
            # The standard library checks that the key matches the certificate.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self._cert, self._key)
            pair = (self._key.read_bytes(), self._cert.read_bytes())
        except OSError as e:  # ssl.SSLError included
            raise ExposureError(f"--tls-cert {str(self._cert)!r} / --tls-key {str(self._key)!r}: "
                                f"cannot use the pair: {e}") from None
        return grpc.ssl_server_certificate_configuration([pair])


def admin_token(settings: Settings) -> TokenFile | None:
    """The token of --admin-token-file, whose holders may load and unload models."""
    path = settings.admin_token_file
    return TokenFile(path, "--admin-token-file") if path else None


def holds(token: TokenFile | None, authorization: bytes) -> bool:
    """Whether a call that sent `authorization` (gRPC's metadata, REST's header) carries `token`
    (none configured: never), compared in constant time."""
    return token is not None and hmac.compare_digest(authorization, token.bearer())
