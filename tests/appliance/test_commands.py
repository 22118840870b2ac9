"""Management commands: create a channel (files and record, or a clear error and
nothing), issue a token."""
from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels
from appliance.models import ApiToken, Channel, hash_key

pytestmark = pytest.mark.django_db


def test_create_channel_makes_the_record_and_the_files(tmp_path: Path) -> None:
    out = StringIO()
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        call_command("create_channel", "orders", "--partitions", "2", "--set",
                     "capacity=50000", "--set", "durability=policy", "--set",
                     "flush_ms=1000", "--set", "minimum_required_space=0", stdout=out)
    row = Channel.objects.get(name="orders")
    assert (row.partitions, row.capacity, row.durability) == (2, 50000, "policy")
    assert (tmp_path / "orders" / "checkpoint" / "channel.json").is_file()
    assert "created channel 'orders'" in out.getvalue()
    # a new channel (Channel.create): its first checkpoint is there at once, so no open
    # of it has anything to report
    assert (tmp_path / "orders" / "checkpoint" / "checkpoint").is_file()
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        status = channels.open_channel(row).status()
    assert (status["recovery"]["problems"], status["health"]) == ([], "healthy")
    channels.close_all()


def test_create_channel_sets_what_the_api_sets(tmp_path: Path) -> None:
    """One definition of the settings: the export's, the Kafka sink's, the schedules' and
    puts_paused too, as POST /api/v1/channels takes them."""
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        call_command("create_channel", "orders", "--set", "minimum_required_space=0",
                     "--set", "export_interval_ms=60000", "--set", "export_format=json",
                     "--set", "kafka_topic=orders", "--set", "kafka_bootstrap=k1:9092",
                     "--set", "kafka_interval_ms=5000", "--set", "puts_paused=true",
                     stdout=StringIO())
    row = Channel.objects.get(name="orders")
    assert (row.export_interval_ms, row.export_format, row.kafka_topic, row.kafka_bootstrap,
            row.kafka_interval_ms, row.puts_paused) == (60000, "json", "orders", "k1:9092",
                                                         5000, True)


@pytest.mark.parametrize(("args", "message"), [
    (["Bad"], "name"),
    (["ok", "--set", "capacity=0"], "capacity"),
    (["ok", "--set", "colour=red"], "KEY=VALUE"),
    (["ok", "--set", "kafka_partitioning=random"], "kafka_partitioning"),
    (["ok", "--set", "puts_paused=maybe"], "puts_paused"),
])
def test_create_channel_refuses_bad_settings_and_writes_nothing(tmp_path: Path,
                                                                args: list[str],
                                                                message: str) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]), pytest.raises(CommandError,
                                                                     match=message):
        call_command("create_channel", *args)
    assert not Channel.objects.exists() and not any(tmp_path.iterdir())


def test_create_token_prints_the_key_once(tmp_path: Path) -> None:
    out = StringIO()
    call_command("create_token", "ingest", "--role", "produce", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    assert ApiToken.objects.get(key_hash=hash_key(key)).roles == ["produce"]
    with pytest.raises(CommandError, match="no channel"):
        call_command("create_token", "x", "--role", "consume", "--channel", "nope")


def test_revoke_token_refuses_the_token_from_then_on() -> None:
    token, key = ApiToken.issue("ingest", ["admin"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/channels").status_code == 200  # now cached by this process
    out = StringIO()
    call_command("revoke_token", token.prefix, stdout=out)
    assert "revoked" in out.getvalue()
    assert client.get("/api/v1/channels").status_code == 401
    with pytest.raises(CommandError, match="already"):
        call_command("revoke_token", token.prefix)
    with pytest.raises(CommandError, match="no token"):
        call_command("revoke_token", "ffffffff")


def test_channel_tool_runs_the_engine_tools_by_channel_name(tmp_path: Path) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        call_command("create_channel", "orders", "--set", "minimum_required_space=0")
        out = StringIO()
        call_command("channel_tool", "stat", "orders", stdout=out)
        assert "channel 'orders': 0 events untaken" in out.getvalue()
        out = StringIO()
        call_command("channel_tool", "verify", "orders", stdout=out)
        assert "sound" in out.getvalue()
        (tmp_path / "orders" / "checkpoint" / "checkpoint").write_bytes(b"WCKP damaged")
        with pytest.raises(CommandError, match="problems"):
            call_command("channel_tool", "verify", "orders", stdout=StringIO())
        with pytest.raises(CommandError, match="no channel"):
            call_command("channel_tool", "stat", "nope")


def test_channel_tool_recovers_a_damaged_channel_json_from_the_database(tmp_path: Path) -> None:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        call_command("create_channel", "orders", "--partitions", "2", "--set",
                     "minimum_required_space=0", "--set", "capacity=50000")
        home = tmp_path / "orders" / "checkpoint"
        (home / "channel.json").write_bytes(b'{"format": "weir-channel-con')
        out = StringIO()
        with pytest.raises(CommandError, match="problems"):
            call_command("channel_tool", "verify", "orders", stdout=out)
        assert f"DAMAGE {home / 'channel.json'}: byte " in out.getvalue()
        assert "channel 'orders': 2 partitions" in out.getvalue()  # the rest still checked
        out = StringIO()
        call_command("channel_tool", "recover", "orders", stdout=out)
        assert f"moved aside: {home / 'channel.json'} -> {home / 'channel.json.damaged'}" \
            in out.getvalue()
        assert "files moved aside: 1" in out.getvalue()
        assert json.loads((home / "channel.json").read_text())["capacity"] == 50000
        out = StringIO()
        call_command("channel_tool", "verify", "orders", stdout=out)
        assert "sound" in out.getvalue()


def test_the_models_have_every_migration() -> None:
    """A model change (a help text too) without its migration would leave a fresh install's
    database behind the code."""
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)  # SystemExit(1) if not
    assert "No changes detected" in out.getvalue()
