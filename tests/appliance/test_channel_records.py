"""Channel rows become engine configs in one place, checked like the engine checks them,
with the appliance's own rule (directories inside WEIR_DATA_ROOT); tokens are stored
hashed and carry roles and channel scopes."""
from __future__ import annotations

from pathlib import Path

import pytest
from appliance_helpers import make_files
from django.core.exceptions import ValidationError
from django.test import RequestFactory
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from appliance import channels
from appliance.auth import TokenAuthentication
from appliance.models import ApiToken, Channel, hash_key
from channel_engine import ChannelConfig

pytestmark = pytest.mark.django_db


def row(root: Path, name: str = "orders", **settings: object) -> Channel:
    return Channel(name=name, data_dirs=[str(root / "data")],
                   checkpoint_dir=str(root / name), minimum_required_space=0, **settings)


def test_a_row_becomes_the_engine_config_with_the_engine_defaults(root: Path) -> None:
    config = channels.to_config(row(root, partitions=3))
    assert isinstance(config, ChannelConfig)
    assert config.partitions == 3 and config.data_dirs == (str(root / "data"),)
    assert config.capacity == ChannelConfig.__dataclass_fields__["capacity"].default


@pytest.mark.parametrize(("changes", "field"), [
    ({"name": "Bad Name"}, "name"),
    ({"partitions": 0}, "partitions"),
    ({"capacity": 5, "transaction_capacity": 10}, "transaction_capacity"),
    ({"durability": "sometimes"}, "durability"),
    ({"compression": "rot13"}, "compression"),
    ({"use_dual_checkpoints": True}, "backup_checkpoint_dir"),
])
def test_a_bad_setting_is_refused_naming_the_field(root: Path, changes: dict[str, object],
                                                   field: str) -> None:
    with pytest.raises(ValidationError) as info:
        channels.to_config(row(root, **changes))
    assert field in info.value.message_dict


def test_directories_must_lie_inside_the_data_root(root: Path, tmp_path_factory:
                                                   pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    bad = row(root)
    bad.data_dirs = [str(outside)]
    with pytest.raises(ValidationError) as info:
        channels.to_config(bad)
    assert "WEIR_DATA_ROOT" in info.value.message_dict["data_dirs"][0]
    sneaky = row(root)
    sneaky.checkpoint_dir = str(root / ".." / outside.name)
    with pytest.raises(ValidationError) as info:
        channels.to_config(sneaky)
    assert "checkpoint_dir" in info.value.message_dict


def test_open_channel_opens_once_and_again_after_a_change(root: Path) -> None:
    record = row(root)
    record.save()
    make_files(record)  # as the create does: a saved row whose files are missing is refused
    first = channels.open_channel(record)
    assert channels.open_channel(record) is first
    with first.put() as tx:
        tx.put(b"kept")
    record.capacity, record.transaction_capacity = 500, 100
    record.save()
    second = channels.open_channel(record)
    assert second is not first and second.config.capacity == 500
    assert second.status()["events_untaken"] == 1


def test_tokens_are_stored_hashed_and_scoped(root: Path) -> None:
    orders, audit = row(root), row(root, name="audit")
    orders.save()
    audit.save()
    token, key = ApiToken.issue("producer", ["produce"], [orders])
    assert token.key_hash == hash_key(key) and key not in str(vars(token))
    assert token.allows("produce", orders) and not token.allows("produce", audit)
    assert not token.allows("consume", orders)
    admin, _ = ApiToken.issue("ops", ["admin"])
    assert admin.allows("consume", audit) and admin.allows("produce", None)
    with pytest.raises(ValueError, match="roles"):
        ApiToken.issue("nobody", ["root"])


def test_token_authentication_accepts_bearer_and_refuses_bad_keys(root: Path) -> None:
    token, key = ApiToken.issue("producer", ["produce"])
    auth = TokenAuthentication()
    factory = RequestFactory()
    user, found = auth.authenticate(Request(factory.get("/", HTTP_AUTHORIZATION=f"Bearer {key}")))
    assert found == token and user.is_authenticated
    assert auth.authenticate(Request(factory.get("/"))) is None
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(Request(factory.get("/", HTTP_AUTHORIZATION="Bearer weir_nope")))
    token.revoke()
    with pytest.raises(AuthenticationFailed, match="revoked"):
        auth.authenticate(Request(factory.get("/", HTTP_AUTHORIZATION=f"Token {key}")))
