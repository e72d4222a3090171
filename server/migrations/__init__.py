"""Alembic migrations of the index schema (``neffcache.server.db.migrate`` runs them)."""
