"""The neffcache index server: catalog of entries, events, leases, tokens, dashboard, metrics.

``create_app(settings)`` in :mod:`neffcache.server.app` builds a FastAPI application; nothing in
this package holds a module-level app or engine, so tests and several replicas in one process
never share state by accident. SQLite is the embedded default, PostgreSQL the production database.
"""
