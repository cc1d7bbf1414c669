from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def redis_client() -> redis.Redis:
    """One pooled client per process, short timeouts so a dead Redis is reported, not waited on."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=5, health_check_interval=30)
