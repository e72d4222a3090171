"""Alembic migrations of the index schema (``neffcache.server.storage.db.migrate`` runs them)."""
