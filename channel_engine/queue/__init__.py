"""The queue layer: a channel's semantics over its partition logs, in one process.

Per-partition queues of offsets not yet taken (partition_queue), the checkpoint and the
commit journals that follow it (checkpoint, commit_journal), opening a channel by replay
(channel_recovery), put batches (put_batch), the channel's settings (channel_config), the
files of its home (home_files), the losses it met (loss_ledger), and the in-process owner
that holds it all under the channel lock (channel_owner), composed of its parts over a
shared state (channel_state): home_lock and home_setup, puts, takes, losses, checkpointer,
channel_status. operations names every operation of the owner (OwnerOperations), which
the owner here and the owner layer's socket client both offer.

May import: the log layer and the base modules. Never owner, tools, channel or spark
(tests/test_import_layers.py checks).
"""
