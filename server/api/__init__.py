"""The HTTP API: request dependencies (settings, database, token checks), the bodies only the
API speaks, and one router per resource under ``routes/``.

May import ``services``, ``storage``, ``observability`` and ``config``; never ``ui`` (the
dashboard builds on the API, not the other way round).
"""
