"""The index database: engines and sessions for SQLite and PostgreSQL, the SQLAlchemy models,
and the Alembic migrations (with ``alembic.ini``) that mirror them.

May import ``config`` only; nothing above it (``services``, ``api``, ``observability``, ``ui``).
"""
