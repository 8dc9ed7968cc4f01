"""Serves the snapshot service alone: `python -m simrun_snapshot --store DIR --address HOST:PORT`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from simrun_core.rpc.auth import add_token_arguments, tokens_from_arguments
from simrun_core.rpc.serving import serve
from simrun_core.rpc.tls import add_tls_arguments, tls_from_arguments
from simrun_core.telemetry import process_telemetry

from simrun_snapshot.server import create_server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simrun_snapshot", description=__doc__)
    parser.add_argument("--store", type=Path, required=True, help="root of the run store")
    parser.add_argument("--address", default="127.0.0.1:50053", help="host:port to listen on (default %(default)s)")
    add_token_arguments(parser)
    add_tls_arguments(parser)
    args = parser.parse_args(argv)
    tls = tls_from_arguments(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    tokens = tokens_from_arguments(parser, args)
    telemetry = process_telemetry("simrun-snapshot")
    bound = create_server(
        args.store, args.address, tokens, tls=tls, insecure=args.insecure, telemetry=telemetry
    ).start()
    log = logging.getLogger("simrun_snapshot")
    serve(
        bound, telemetry=telemetry, ready=lambda: log.info("serving snapshots of %s on port %d", args.store, bound.port)
    )


if __name__ == "__main__":
    main()
