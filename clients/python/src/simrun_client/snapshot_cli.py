"""`simrun-snapshot PATH --store DIR | --server ADDRESS`: snapshot a working tree and print it as one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from simrun_core.errors import SimrunError

from simrun_client.channel import open_channel
from simrun_client.snapshots import snapshot_to_store, upload_snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="simrun-snapshot",
        description="Snapshot the files git knows of a working tree into the run store; print the snapshot as JSON.",
    )
    parser.add_argument("path", type=Path, help="the working tree (its top level or a folder in it)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", type=Path, help="root of the run store, mounted on this machine")
    where.add_argument("--server", metavar="ADDRESS", help="host:port of the snapshot service (or the gateway)")
    parser.add_argument("--name", help="the source name (default: the tree's folder name)")
    parser.add_argument("--token", default=os.environ.get("SIMRUN_TOKEN"), help="bearer token (env SIMRUN_TOKEN)")
    args = parser.parse_args(argv)
    try:
        if args.store is not None:
            result = snapshot_to_store(args.path, args.store, args.name)
        else:
            channel = open_channel(args.server, args.token)
            try:
                result = upload_snapshot(args.path, channel, args.name)
            finally:
                channel.close()
    except SimrunError as exc:
        print(f"simrun-snapshot: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json(), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
