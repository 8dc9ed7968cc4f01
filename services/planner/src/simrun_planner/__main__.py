"""Serves the planner alone: `python -m simrun_planner --address 127.0.0.1:50051`."""

from __future__ import annotations

import argparse
import logging

from simrun_core.rpc.auth import add_token_arguments, tokens_from_arguments
from simrun_core.rpc.serving import serve
from simrun_core.rpc.tls import add_tls_arguments, tls_from_arguments
from simrun_core.telemetry import process_telemetry

from simrun_planner.server import create_server


def main(argv: list[str] | None = None) -> None:
    """Parses the arguments, starts the server and serves until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m simrun_planner", description="Serve the simrun planner.")
    parser.add_argument("--address", default="127.0.0.1:50051", help="host:port to listen on")
    add_token_arguments(parser)
    add_tls_arguments(parser)
    args = parser.parse_args(argv)
    tls = tls_from_arguments(parser, args)
    logging.basicConfig(level=logging.INFO)
    tokens = tokens_from_arguments(parser, args)
    telemetry = process_telemetry("simrun-planner")
    bound = create_server(args.address, tokens=tokens, tls=tls, insecure=args.insecure, telemetry=telemetry).start()
    log = logging.getLogger(__name__)
    serve(bound, telemetry=telemetry, ready=lambda: log.info("planner serving on port %d", bound.port))


if __name__ == "__main__":
    main()
