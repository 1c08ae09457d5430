"""How a job's client connects to a daemon: plainly on its unix socket (after checking whose it
is), or with TLS and a bearer token on its TCP port (files on every node)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as grpcclient

from service import local_daemon


@dataclass(frozen=True)
class Credentials:
    """TLS and a bearer token for a daemon exposed on TCP (its unix socket needs neither).
    Paths name files present on every node; the token is read there, never shipped."""

    root_certificates: str | None = None  # PEM CA the daemon's certificate chains to
    token_file: str | None = None  # holds the daemon's --token-file token

    def __bool__(self) -> bool:
        return bool(self.root_certificates or self.token_file)

    def applies_to(self, address: str) -> bool:
        return bool(self) and not address.startswith("unix:")

    def connect(self, address: str) -> tuple[grpcclient.InferenceServerClient, dict | None]:
        """A client for `address` and the headers its calls carry. Set credentials mean TLS
        (system CAs where no root certificate is given): a token never travels in plaintext.
        A unix socket must be the expected user's daemon's (local_daemon.check)."""
        local_daemon.check(address)
        if not self.applies_to(address):
            return grpcclient.InferenceServerClient(address), None
        client = grpcclient.InferenceServerClient(address, ssl=True,
                                                  root_certificates=self.root_certificates)
        if self.token_file is None:
            return client, None
        token = Path(self.token_file).read_text().strip()
        return client, {"authorization": f"Bearer {token}"}


NO_CREDENTIALS = Credentials()
