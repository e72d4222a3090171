"""Alembic revision files, oldest first."""
