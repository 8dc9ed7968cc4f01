"""The snapshot format: content-named copies of working trees in the store, their files, tars and messages.

Shared by the snapshot service, which writes snapshots it receives, and the client, which writes them into a
mounted store or uploads them; so a client installs the format without the service.
"""
