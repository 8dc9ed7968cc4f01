"""Serves the run tracker alone: `python -m simrun_tracker --config server.yaml` (learner at services.learner)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from simrun_core.config import ServerConfig, private_dir
from simrun_core.errors import InvalidArgument, SimrunError
from simrun_core.homelock import HomeLock
from simrun_core.rpc.auth import add_no_auth_argument, tokens_from_arguments
from simrun_core.rpc.serving import serve
from simrun_core.telemetry import process_telemetry
from simrun_learner.learner import ResourceLearner
from simrun_runtime.layout import StoreLayout

from simrun_tracker.server import TELEMETRY_NAME, build_tracker, check_pod_folders, create_server


def main(argv: list[str] | None = None) -> int:
    """Starts the tracker with the config's store, nodes and learner; serves until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m simrun_tracker", description="Serve the simrun run tracker.")
    parser.add_argument("--config", type=Path, required=True, help="server config (YAML): store, address, ...")
    add_no_auth_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        config = ServerConfig.load(args.config)
        tokens = tokens_from_arguments(parser, args, config.tokens_file, option="tokens_file: in the config")
        telemetry = process_telemetry(TELEMETRY_NAME)
    except InvalidArgument as exc:
        parser.exit(2, f"simrun-tracker: error: {exc}\n")
    store = StoreLayout(config.store)
    try:
        check_pod_folders(config)
        private_dir(store.root, config.share_group)
        lock = HomeLock(store.root, names=("store",))  # one tracker per store: two would drive the same runs
    except SimrunError as exc:
        parser.exit(2, f"simrun-tracker: error: {exc}\n")
    learner = None if config.services.learner else ResourceLearner(store.observations)
    tracker = build_tracker(config, store, learner, telemetry=telemetry)
    bound = create_server(tracker, config.address, tokens, config.tls, telemetry=telemetry).start()
    tracker.start()
    log = logging.getLogger(__name__)
    serve(
        bound,
        cleanup=[tracker.close, *([learner.close] if learner is not None else []), lock.release],
        telemetry=telemetry,
        ready=lambda: log.info("run tracker serving on port %d with the store %s", bound.port, store.root),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
