"""A channel the release before subscriptions wrote (golden/channel-v3: checkpoint v3,
commit journal v1, killed with a take in flight and a commit journalled after its last
checkpoint) opens unchanged: its queue becomes subscription `default`, every untaken event
is delivered once, and the files are upgraded (checkpoint v4, journal v2) by the open."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from channel_engine import Channel, ChannelConfig
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal

GOLDEN = Path(__file__).parent / "golden" / "channel-v3"


def golden_copy(tmp_path: Path) -> ChannelConfig:
    """A copy of the golden channel under tmp_path, and its config: its channel.json read
    as written, then saved with the copy's directories (the maker's are absolute paths)."""
    base = tmp_path / "golden"
    shutil.copytree(GOLDEN, base)
    written = ChannelConfig.load(base / "home")
    assert written.segment_bytes == 1024 and written.partitions == 2  # as the maker set
    moved = written.replace(data_dirs=[str(base / "data")], checkpoint_dir=str(base / "home"))
    moved.save()
    return moved


def test_a_channel_of_the_release_before_subscriptions_opens_unchanged(tmp_path: Path) -> None:
    config = golden_copy(tmp_path)
    expected = json.loads((GOLDEN / "expected.json").read_text())["untaken"]
    with Channel.open(config) as channel:
        status = channel.status()
        assert status["events_untaken"] == len(expected) == 11
        assert status["recovery"]["take_commits_replayed"] == 1
        # a v3 checkpoint has no counters: from 0, plus what replay recounts (the take of 4
        # committed after the checkpoint; every put came before it)
        assert status["recovery"]["counters_recounted"] == {"take_attempts": 4,
                                                            "take_successes": 4}
        assert (status["counters"]["take_successes"], status["counters"]["put_successes"]) \
            == (4, 0)
        # the take left in flight began after the checkpoint: its events were never taken
        with channel.take() as tx:
            got = tx.take(100)
        assert sorted([e.partition, e.offset, e.body.decode()] for e in got) == expected
        assert channel.status()["events_untaken"] == 0
    with Channel.open(config) as channel:  # counters written in the new format, kept
        assert channel.status()["counters"]["take_successes"] == 4 + 11
    home = config.home
    assert checkpoint_file.read(home / checkpoint_file.FILE_NAME).version \
        == checkpoint_file.VERSION == 5
    journals = sorted(home.glob("commits-*.journal"))
    assert journals and all(j.read_bytes()[4] == commit_journal.VERSION for j in journals)
