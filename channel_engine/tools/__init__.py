"""The operator's tools: `python -m channel_engine dump | verify | recover | ...`.

The command line (cli), the read-only check of a channel's files (verify) and the
repair of what verify reports (recover).

May import: every layer below (channel, owner, queue, log, base). Nothing in the
engine imports the tools (tests/test_import_layers.py checks).
"""
