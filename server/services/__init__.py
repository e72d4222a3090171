"""What the index does, one module per resource: the catalog of entries, events and their
hourly rollups, leases, statistics, tokens, and ``admin`` (the CLI's way in: tokens and
schema without a running server). Functions take a SQLAlchemy session and the records in
``records``; none knows about HTTP.

May import ``storage`` and ``config``; never ``api``, ``ui`` or ``observability``.
"""
