"""Puts (channel_engine/queue/puts.py): a put begun and finished later (the owner loop's
round) is acknowledged only if what begin wrote is what finish made durable."""
from __future__ import annotations

from pathlib import Path

import pytest
from channel_helpers import make_config

from channel_engine import Channel, PendingEvent
from channel_engine.errors import StorageError
from channel_engine.queue import put_batch


def test_a_put_whose_batch_a_truncation_removed_before_its_finish_is_not_acknowledged(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, partitions=1)
    with Channel.open(config) as channel:
        owner = channel.owner
        assert owner is not None
        encoded = put_batch.encode([PendingEvent(b"begun")], put_batch.Partitioner(), 1, "none")
        pending = owner.puts.begin(*encoded)
        log = owner.logs[0]
        log.truncate_to(0)  # e.g. a reset: the begun batch is gone
        log.append([PendingEvent(b"other-%d" % i) for i in range(3)])  # past its end again
        with pytest.raises(StorageError, match="truncate_to removed"):
            owner.puts.finish(pending)
        assert owner.state.unresolved[0] == {}  # aborted, not committed
