"""The log layer: one partition's Kafka-format log on disk.

Record batches (record_batch); segments with their sparse offset and time indexes
(segment, owning segment_reader and segment_recovery over its segment_file; damage for
the rules that tell damage from a torn write; offset_index, time_index, index_file); the
partition log that appends, reads, rolls, retains and recovers them (partition_log,
owning log_append, log_flush, log_truncate, log_retention, log_read and log_status over
its partition_state); fetch, the committed batches of a range as a reader carries them
away (a file slice or opened bytes); its loader (loader, with strays and known_end); its
`log.state` file (state), its settings (config)
and what opening it found (recovery). See ../FORMAT.md.

May import: the base modules at the top of the package (errors, event, atomic_file,
disk_space, filenames, encryption) and other log modules. Never queue, owner, tools,
channel or spark (tests/test_import_layers.py checks).
"""
