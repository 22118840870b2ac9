"""The owner layer: one process owns a channel and serves the others over a Unix socket.

The wire protocol (protocol: frames, and how each operation of OwnerOperations travels),
the server that runs beside the owning ChannelOwner (server) and the client the other
processes use in its place (client, an OwnerOperations over the socket).

May import: the queue and log layers and the base modules. Never tools, channel or
spark (tests/test_import_layers.py checks).
"""
