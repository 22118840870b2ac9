"""What a tool's PATH is, and the settings an operator supplies (shared by the CLI's tools).

PATH is a channel's home when it holds channel.json, a checkpoint or a commit
journal (or settings are supplied), else a partition directory. Settings come
from main's `config` (a database, say) or `--config FILE` (a JSON object as
channel.json holds them). Owns no bytes. Failures: UsageError for a PATH that is
no directory, ConfigError naming the file for unreadable settings.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import cast

from channel_engine.errors import (
    ConfigError,
    UsageError,
)
from channel_engine.filenames import (
    DAMAGED_SUFFIX,
)
from channel_engine.queue import checkpoint as checkpoint_file
from channel_engine.queue import commit_journal
from channel_engine.queue.channel_config import CONFIG_FILE, ChannelConfig


def require_dir(path: Path) -> None:
    """Refuse (UsageError) a PATH that is not a directory."""
    if not path.is_dir():
        raise UsageError(f"{path}: no such partition directory")


def is_channel(path: Path) -> bool:
    """True if PATH holds a channel.json."""
    return (path / CONFIG_FILE).is_file()


def is_home(path: Path, args: argparse.Namespace) -> bool:
    """A channel's home, even with channel.json damaged or gone (see the module doc)."""
    if args.supplied is not None or getattr(args, "config", None) is not None:
        return True
    names = (CONFIG_FILE, CONFIG_FILE + DAMAGED_SUFFIX, checkpoint_file.FILE_NAME)
    return any(os.path.lexists(path / name) for name in names) or (
        path.is_dir() and bool(commit_journal.generations(path)))


def supplied_config(args: argparse.Namespace) -> ChannelConfig | None:
    """The settings given by the caller (main's config) or in --config FILE."""
    if args.supplied is not None or args.config is None:
        return cast(ChannelConfig | None, args.supplied)
    try:
        document = json.loads(args.config.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError("config", f"{args.config}: cannot be read as JSON ({exc})") from exc
    return ChannelConfig.from_document(document, args.config)
