"""Test certificates made with `openssl`: a CA, a server certificate for 127.0.0.1 and a client certificate."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(folder: Path) -> Certificates:
    """A fresh CA and two certificates it signed (the server's names 127.0.0.1 and localhost), in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=simrun test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=folder)  # fmt: skip
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=folder)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=folder)  # fmt: skip
    return Certificates(
        folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "client.pem", folder / "client.key"
    )
