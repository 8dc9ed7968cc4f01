"""Serves the gateway: `python -m simrun_gateway --config server.yaml`; services without an address run inside it."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from simrun_core.config import ServerConfig
from simrun_core.errors import InvalidArgument

from simrun_gateway.embedded import serve


def main(argv: list[str] | None = None) -> int:
    """Loads the config and serves until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m simrun_gateway", description="Serve the simrun gateway.")
    parser.add_argument("--config", type=Path, help="server config (YAML); the defaults without one")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        config = ServerConfig.load(args.config) if args.config else ServerConfig()
        serve(config, ready=lambda s: logging.getLogger(__name__).info("gateway serving on %s", s.address))
    except InvalidArgument as exc:
        parser.exit(2, f"simrun-gateway: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
