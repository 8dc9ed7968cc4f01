"""Channels from one simrun service to another: TLS verified against the config's CA when it names one."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc

from simrun_core.config import TlsConfig


def service_credentials(tls: TlsConfig | None) -> grpc.ChannelCredentials | None:
    """The credentials of a channel to a service apart: None (plaintext) without `tls.ca`; else TLS verified
    against `tls.ca`, presenting the config's own certificate when its servers ask for client certificates
    (`tls.client_ca`)."""
    if tls is None or tls.ca is None:
        return None
    mutual = tls.client_ca is not None
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.key.read_bytes() if mutual else None,
        certificate_chain=tls.cert.read_bytes() if mutual else None,
    )


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The TLS options of a service's `__main__`: --tls-cert, --tls-key, --tls-client-ca, --insecure."""
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate to serve TLS with (with --tls-key)")
    parser.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")
    parser.add_argument("--tls-client-ca", type=Path, help="PEM CA: ask clients for certificates it signed")
    parser.add_argument(
        "--insecure", action="store_true", help="serve plaintext beyond loopback (tokens cross in the clear)"
    )


def tls_from_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TlsConfig | None:
    """The TLS config of the parsed options; a usage error for a certificate without its key."""
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_cert is None:
        if args.tls_client_ca is not None:
            parser.error("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    return TlsConfig(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
