"""Key files of encrypted channels: chosen by name in WEIR_KEY_DIR, checked before use.

A channel's `encryption_key_file` is the NAME of a file in WEIR_KEY_DIR (letters,
digits, `.`, `_`, `-`; no slash, never `.` or `..`), not a path: an API token or a
staff user picks one of the keys the operator put there and can make the appliance
read nothing else. key_path() turns the name into the absolute path the engine reads
(channel_engine/encryption.py, key file format v2, unchanged) after checking:

- WEIR_KEY_DIR is a directory of the appliance's user closed to group and others
  (0700; the settings create it so and refuse to start otherwise, appliance.env);
- the file is a regular file (a symlink only to a regular file in the same directory:
  never a device such as /dev/zero, a FIFO, a directory, or a file elsewhere), of at
  most MAX_KEY_FILE_BYTES.

check_keys() then loads it (the engine's own bounded read) to prove it is a Weir key
file holding the active key. Every refusal is a ValidationError naming the setting
(encryption_key_file, or encryption_active_key for a missing key id), raised by
appliance.channels.to_config() before anything is saved or opened.
"""
from __future__ import annotations

import re
import stat
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError

from appliance.env import private_dir_problem
from channel_engine import ChannelConfig, ConfigError
from channel_engine.encryption import MAX_KEY_FILE_BYTES, KeyRing

FIELD = "encryption_key_file"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def _refuse(reason: str) -> ValidationError:
    return ValidationError({FIELD: reason})


def key_dir() -> Path:
    """WEIR_KEY_DIR, or ValidationError saying why it may not be used."""
    directory = Path(settings.WEIR_KEY_DIR)
    problem = private_dir_problem(directory)
    if problem:
        raise _refuse(f"WEIR_KEY_DIR {directory} {problem}: no key file is read from it")
    return directory


def key_path(name: object) -> Path:
    """The absolute path of the key file `name` in WEIR_KEY_DIR, checked (module doc)."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise _refuse(f"must be the name of a file in WEIR_KEY_DIR (letters, digits, '.', "
                      f"'_', '-'; no slashes), not {name!r}")
    directory = key_dir().resolve()
    path = (directory / name).resolve()  # a symlink: where it points
    if path.parent != directory:
        raise _refuse(f"{name!r} is a symlink out of WEIR_KEY_DIR ({directory})")
    try:
        info = path.stat()
    except FileNotFoundError:
        raise _refuse(f"no key file {name!r} in WEIR_KEY_DIR ({directory})") from None
    except OSError as exc:
        raise _refuse(f"{name!r} in WEIR_KEY_DIR cannot be read "
                      f"({exc.strerror or exc})") from exc
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(f"{name!r} in WEIR_KEY_DIR is not a regular file")
    if info.st_size > MAX_KEY_FILE_BYTES:
        raise _refuse(f"{name!r} in WEIR_KEY_DIR has {info.st_size} bytes; a key file has "
                      f"at most {MAX_KEY_FILE_BYTES}")
    return path


def check_keys(config: ChannelConfig) -> None:
    """Load the config's key file as the engine will (ValidationError naming the setting)."""
    if config.encryption_key_file is None or config.encryption_active_key is None:
        return
    try:
        KeyRing.load(config.encryption_key_file, config.encryption_active_key)
    except ConfigError as exc:
        raise ValidationError({exc.field: exc.reason}) from exc
    except OSError as exc:  # vanished or changed since key_path() looked
        raise _refuse(f"cannot be read ({exc.strerror or exc})") from exc
