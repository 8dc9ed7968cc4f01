"""`simrun-mcp`: serves simrun's tools to an MCP host over stdio (the default) or streamable HTTP on loopback."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from simrun_core.config import DEFAULT_ENDPOINT
from simrun_core.errors import SimrunError

from simrun_mcp.roots import ROOTS_VARIABLE, Roots
from simrun_mcp.server import DEFAULT_MAX_STREAMS, connect

DEFAULT_HTTP_PORT = 8765


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simrun-mcp",
        description="The MCP bridge of simrun: tools an agent calls to submit, watch, compare and cancel runs. "
        "It calls simrun with the agent's own token, so simrun decides the runs' priority, and keeps no state.",
    )
    parser.add_argument(
        "--endpoint",
        default=os.environ.get("SIMRUN_ENDPOINT") or DEFAULT_ENDPOINT,
        metavar="HOST:PORT",
        help="Where simrun (its gateway) listens; default: $SIMRUN_ENDPOINT, else %(default)s.",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="Bearer token of the agent; default: $SIMRUN_TOKEN, else the token file of `simrun server` "
        "($SIMRUN_HOME/token). Prefer the variable: arguments are visible to other users of the machine.",
    )
    parser.add_argument(
        "--root",
        action="append",
        dest="roots",
        metavar="DIR",
        help=f"A folder the agent may submit workflows from (repeatable); default: ${ROOTS_VARIABLE} "
        "(separated by the path separator), else the working directory.",
    )
    parser.add_argument(
        "--http", action="store_true", help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio."
    )
    parser.add_argument("--host", default="127.0.0.1", help="Loopback address to serve HTTP on; default %(default)s.")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_HTTP_PORT, help="Port to serve HTTP on; default %(default)s."
    )
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="The longest a tool waits for simrun (a watch waits its own timeout on top); default %(default)s.",
    )
    parser.add_argument(
        "--max-streams",
        type=int,
        default=DEFAULT_MAX_STREAMS,
        metavar="N",
        help="Watches that may hold a WatchRun stream (a server thread each) at once; further ones poll. "
        "Default %(default)s.",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    # stdout is the protocol on stdio: everything else goes to stderr.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="simrun-mcp: %(message)s")
    if args.http:
        try:
            loopback = ipaddress.ip_address(args.host).is_loopback
        except ValueError:
            loopback = args.host == "localhost"
        if not loopback:
            sys.exit(f"simrun-mcp: --host {args.host} is not a loopback address; the bridge serves this machine only")
    if args.call_timeout <= 0:
        sys.exit("simrun-mcp: --call-timeout must be positive")
    if args.max_streams < 0:
        sys.exit("simrun-mcp: --max-streams must be 0 or more")
    try:
        server, bridge = connect(
            args.endpoint,
            args.token,
            Roots.from_environment(args.roots),
            call_timeout_s=args.call_timeout,
            max_streams=args.max_streams,
        )
    except SimrunError as exc:
        sys.exit(f"simrun-mcp: {exc}")
    try:
        if args.http:
            server.run("streamable-http", host=args.host, port=args.port)
        else:
            server.run("stdio")
    except KeyboardInterrupt:
        pass
    finally:
        bridge.client.close()
        bridge.telemetry.shutdown()  # exports the spans still buffered (a no-op without an exporter)


if __name__ == "__main__":
    main()
