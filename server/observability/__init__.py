"""What the server tells about itself: the Prometheus registry (request counters and latency,
cache facts read from the database) and the ASGI middleware that feeds it and bounds bodies.

May import ``services``, ``storage`` and ``config``; never ``api`` or ``ui``.
"""
