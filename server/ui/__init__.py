"""The dashboard at ``/``: the page's router, its inline SVG charts, templates and static files.

The top layer: may import ``api`` (its dependencies and query parsing), ``services``,
``observability``, ``storage`` and ``config``.
"""
