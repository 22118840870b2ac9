"""The operator's tools: `python -m channel_engine dump | verify | recover | ...`.

The command line (cli, one module per tool: cli_produce, cli_dump, cli_verify,
cli_stat, cli_recover; what PATH is: cli_paths), the read-only check of a channel's
files (verify: a partition; verify_home: a channel's home; log_scan: the walk of one
.log, shared with dump) and the repair of what verify reports (recover).

May import: every layer below (channel, owner, queue, log, base). Nothing in the
engine imports the tools (tests/test_import_layers.py checks).
"""
