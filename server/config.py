"""Server settings, read from ``NEFFCACHE_SERVER_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'index.db'}"
