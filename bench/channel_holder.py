"""bench/http_ab.py's "ext" contender's owner: a process that is not a web worker opens
channel `bench` first and so owns it, as the Celery worker's child does under
scripts/run.sh (its flusher opens every channel at the first scheduler tick, before any
produce request), so every web worker is a client over owner.sock. Prints "ready" once
it owns; holds the channel until stdin closes.

    python bench/channel_holder.py   (the appliance's environment: WEIR_VAR_DIR, ...)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")


def start(env: dict[str, str]) -> subprocess.Popen[str]:
    """A holder of the appliance of `env`'s channel `bench`, once it owns it."""
    holder = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], cwd=ROOT,
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "ready":
        holder.kill()
        raise SystemExit("bench/channel_holder.py did not take channel bench")
    return holder


def stop(holder: subprocess.Popen[str]) -> None:
    """Let the holder close the channel and exit."""
    holder.communicate(timeout=60)


def main() -> None:
    """Own channel `bench` until stdin closes."""
    import django

    django.setup()
    from appliance import channels
    from appliance.frozen_heap import freeze_startup_objects
    from appliance.models import Channel

    # as a Celery pool process does before its first task (appliance/celery.py)
    freeze_startup_objects()
    handle = channels.open_channel(Channel.objects.get(name="bench"))
    if handle._client is not None:
        raise SystemExit("channel_holder: another process owns channel bench already")
    print("ready", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
