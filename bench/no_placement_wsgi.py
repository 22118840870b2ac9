"""bench/http_ab.py's "placement off" contender: the appliance's WSGI app with the owner's
put placement (queue/put_placement.py) left out, every keyless put appended where its
producer put it, as before placement; nothing else differs."""
from __future__ import annotations

from typing import Any

from channel_engine.queue.puts import Puts

_commit_batches = Puts.commit_batches


def _unmoved(self: Puts, transaction_id: int | None, batches: Any, partitions: int,
             movable: bool = False) -> list[tuple[int, int, int]]:
    """Puts.commit_batches with every put unmovable."""
    return _commit_batches(self, transaction_id, batches, partitions, False)


Puts.commit_batches = _unmoved  # type: ignore[method-assign]

from appliance.wsgi import application  # noqa: E402 - after the patch, in this process

__all__ = ["application"]
