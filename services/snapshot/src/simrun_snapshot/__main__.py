"""Serves the snapshot service alone: `python -m simrun_snapshot --store DIR --address HOST:PORT`."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from types import FrameType

from simrun_core.identity import TokenRegistry
from simrun_core.rpc.tls import add_tls_arguments, tls_from_arguments

from simrun_snapshot.server import create_server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simrun_snapshot", description=__doc__)
    parser.add_argument("--store", type=Path, required=True, help="root of the run store")
    parser.add_argument("--address", default="127.0.0.1:50053", help="host:port to listen on (default %(default)s)")
    parser.add_argument("--tokens", type=Path, help="tokens file; without it calls need no token")
    add_tls_arguments(parser)
    args = parser.parse_args(argv)
    tls = tls_from_arguments(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    tokens = TokenRegistry.load(args.tokens) if args.tokens else None
    bound = create_server(args.store, args.address, tokens, tls=tls, insecure=args.insecure).start()
    logging.getLogger("simrun_snapshot").info("serving snapshots of %s on port %d", args.store, bound.port)
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped.wait()
    bound.stop()


if __name__ == "__main__":
    main()
