"""The neffcache index server: catalog of entries, events, leases, tokens, dashboard, metrics.

``create_app(settings)`` in :mod:`neffcache.server.app` builds a FastAPI application; nothing in
this package holds a module-level app or engine, so tests and several replicas in one process
never share state by accident. SQLite is the embedded default, PostgreSQL the production database.

Folders by layer, lowest first; each imports only its own layer and those below it
(``tests/server/test_layers.py`` checks it), and from the library only values (errors, keys,
toolchain, the index records):

- ``config``: the settings (``NEFFCACHE_SERVER_*``);
- ``storage/``: engines and sessions, the SQLAlchemy models, the Alembic migrations;
- ``services/``: what the index does, per resource, on a session; ``admin`` for the CLI;
- ``observability/``: Prometheus metrics and the middleware that feeds them;
- ``api/``: request dependencies, response bodies, one router per resource;
- ``ui/``: the dashboard page, its charts, templates and static files;
- ``app``: the factory that puts them together, and ``serve`` for the CLI.
"""
