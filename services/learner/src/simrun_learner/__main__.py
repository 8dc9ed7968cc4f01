"""Serves the resource learner alone: `python -m simrun_learner --address 127.0.0.1:50052 --db PATH`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from simrun_core.rpc.auth import add_token_arguments, tokens_from_arguments
from simrun_core.rpc.serving import serve
from simrun_core.rpc.tls import add_tls_arguments, tls_from_arguments
from simrun_core.telemetry import process_telemetry

from simrun_learner.learner import ResourceLearner
from simrun_learner.server import create_server


def main(argv: list[str] | None = None) -> None:
    """Parses the arguments, starts the server and serves until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m simrun_learner", description="Serve the simrun resource learner.")
    parser.add_argument("--address", default="127.0.0.1:50052", help="host:port to listen on")
    parser.add_argument(
        "--db", type=Path, required=True, help="SQLite file of the observations (store root/observations.sqlite)"
    )
    add_token_arguments(parser)
    add_tls_arguments(parser)
    args = parser.parse_args(argv)
    tls = tls_from_arguments(parser, args)
    logging.basicConfig(level=logging.INFO)
    tokens = tokens_from_arguments(parser, args)
    telemetry = process_telemetry("simrun-learner")
    with ResourceLearner(args.db) as learner:
        bound = create_server(
            learner, args.address, tokens=tokens, tls=tls, insecure=args.insecure, telemetry=telemetry
        ).start()
        log = logging.getLogger(__name__)
        serve(
            bound,
            telemetry=telemetry,
            ready=lambda: log.info("resource learner serving on port %d with %s", bound.port, args.db),
        )


if __name__ == "__main__":
    main()
