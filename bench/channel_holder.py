"""bench/http_ab.py's "ext" contender's owner: a process that is not a web worker opens
channel `bench` first and so owns it, as the Celery worker's child does under
scripts/run.sh (its flusher opens every channel at the first scheduler tick, before any
produce request), so every web worker is a client over owner.sock. Prints "ready" once
it owns; holds the channel until stdin closes.

    python bench/channel_holder.py   (the appliance's environment: WEIR_VAR_DIR, ...)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")


def main() -> None:
    """Own channel `bench` until stdin closes."""
    import django

    django.setup()
    from appliance import channels
    from appliance.models import Channel

    handle = channels.open_channel(Channel.objects.get(name="bench"))
    if handle._client is not None:
        raise SystemExit("channel_holder: another process owns channel bench already")
    print("ready", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
