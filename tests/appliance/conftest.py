"""Appliance tests use their own Redis database and key prefix for the shared cache."""
from __future__ import annotations

import os
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _test_cache(settings: Any) -> None:
    settings.CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:6379/15",
        "KEY_PREFIX": f"weir-test-{os.getpid()}",
    }}
