"""Server settings, read from ``NEFFCACHE_SERVER_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from neffcache.instances import known_instance_types

# A price above this per instance-hour is a typo (the largest Trainium instances cost tens).
MAX_PRICE_PER_HOUR = 100_000.0
_CURRENCY_RE = re.compile(r"^[A-Za-z$€£¥]{1,8}$")


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "neffcache" / "server"


class ServerSettings(BaseSettings):
    """Everything the server needs; every field can come from ``NEFFCACHE_SERVER_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="NEFFCACHE_SERVER_", extra="forbid")

    data_dir: Path = Field(default_factory=default_data_dir)
    # None means "SQLite in data_dir": the zero-configuration embedded default.
    database_url: str | None = None
    # Reads (lookups, stats, dashboard, metrics) without a token, for trusted networks.
    anonymous_read: bool = False
    # Events arrive in batches of at most a few thousand; anything far larger is a mistake or abuse.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # A token accepted with admin scope without being in the database: how a fresh deployment
    # creates its first tokens over HTTP (Kubernetes secret -> env var).
    admin_token: SecretStr | None = None
    # Upgrade the schema at startup. Replicas serialise on a PostgreSQL advisory lock.
    auto_migrate: bool = True
    pool_size: int = Field(default=10, ge=1)
    # Raw events older than this are deleted (hourly rollups, and so every chart and counter, stay).
    # Events older than this that arrive late are refused as expired: their ids are gone, so
    # storing them could count a resend twice. 0 keeps everything forever.
    event_retention_days: float = Field(default=90.0, ge=0.0)
    dashboard_refresh_seconds: int = Field(default=60, ge=5)
    # How long a replica trusts a verified token before asking the database again: the delay
    # before a revocation made on another replica takes effect here.
    # FastAPI's native OpenTelemetry tracing/metrics/logs (global providers); off unless wanted.
    opentelemetry: bool = False
    token_cache_seconds: float = Field(default=5.0, ge=0.0, le=300.0)
    # /metrics label values are bounded (a write token could otherwise add a series per made-up
    # team): these teams and toolchains are always exported by name, plus the top N of each by
    # count; every other value is summed into "other".
    metrics_teams: list[str] = Field(default_factory=list)
    metrics_toolchains: list[str] = Field(default_factory=list)
    metrics_top_n: int = Field(default=20, ge=0, le=1000)
    # Instance type -> price per hour, given by the operator (server/services/prices.py says why
    # none are built in); with none, stats stay in hours. NEFFCACHE_SERVER_PRICES is JSON.
    prices: dict[str, float] = Field(default_factory=dict)
    currency: str = "USD"
    # What an unfinished connection may hold (server/connections.py): the headers of a request
    # within this many seconds of its first byte (or of connecting), its body within this many of
    # its headers; else 408 and closed. Connections per worker process, clamped below its
    # descriptor limit; at the cap the longest-waiting idle connection makes room for a new one.
    header_timeout_seconds: float = Field(default=10.0, gt=0.0, le=3600.0)
    body_timeout_seconds: float = Field(default=60.0, gt=0.0, le=3600.0)
    max_connections: int = Field(default=1024, ge=16, le=1_000_000)
    # Failed token checks per client address and minute, per worker process, before that address
    # gets 429 for new tokens (server/api/auth_limits.py); tokens verified already still work.
    auth_failures_per_minute: int = Field(default=30, ge=1, le=100_000)
    # One log line per request (uvicorn's access log). Off by default: at the default log level
    # it cost a third of a worker's lookup throughput (docs/performance.md).
    access_log: bool = False
    # How far back hits weigh the upgrade readiness that /metrics exports (the dashboard uses its window).
    readiness_window_days: float = Field(default=30.0, gt=0.0, le=400.0)

    @field_validator("prices")
    @classmethod
    def _known_types_sane_amounts(cls, prices: dict[str, float]) -> dict[str, float]:
        """Each instance type in the catalog (a misspelt one would price nothing and look like a
        fleet that never misses); each price finite, not negative, not absurd."""
        known = set(known_instance_types())
        for name, price in prices.items():
            if name not in known:
                raise ValueError(f"unknown instance type {name!r} in prices; known: {', '.join(sorted(known))}")
            if not math.isfinite(price) or not 0.0 <= price <= MAX_PRICE_PER_HOUR:
                raise ValueError(f"price for {name} must be from 0 to {MAX_PRICE_PER_HOUR:g} per hour, not {price!r}")
        return prices

    @field_validator("currency")
    @classmethod
    def _short_label(cls, currency: str) -> str:
        if not _CURRENCY_RE.match(currency):
            raise ValueError(f"currency must be a short label such as USD or EUR, not {currency!r}")
        return currency

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'index.db'}"
