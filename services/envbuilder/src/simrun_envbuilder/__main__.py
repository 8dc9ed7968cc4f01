"""Serves the environment builder alone: `python -m simrun_envbuilder --config server.yaml --address HOST:PORT`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from simrun_core.config import ServerConfig
from simrun_core.rpc.auth import add_token_arguments, tokens_from_arguments
from simrun_core.rpc.serving import serve

from simrun_envbuilder.builder import EnvironmentBuilder
from simrun_envbuilder.convert import settings_from_config
from simrun_envbuilder.server import create_server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simrun_envbuilder", description=__doc__)
    parser.add_argument("--config", type=Path, help="server config (store, environments:); defaults without it")
    parser.add_argument("--store", type=Path, help="root of the run store (overrides the config's)")
    parser.add_argument("--address", default="127.0.0.1:50055", help="host:port to listen on (default %(default)s)")
    add_token_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = ServerConfig.load(args.config) if args.config else ServerConfig()
    if args.store:
        config = config.model_copy(update={"store": args.store})
    builder = EnvironmentBuilder(settings_from_config(config))
    tokens = tokens_from_arguments(parser, args)
    bound = create_server(builder, args.address, tokens, config.read_policy).start()
    log = logging.getLogger("simrun_envbuilder")
    serve(
        bound,
        cleanup=[builder.close],
        ready=lambda: log.info("building environments in %s on port %d", builder.root, bound.port),
    )


if __name__ == "__main__":
    main()
