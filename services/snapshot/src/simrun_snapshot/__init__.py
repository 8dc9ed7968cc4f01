"""The snapshot service: content-named snapshots in the store."""
