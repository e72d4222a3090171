"""JSON bodies rendered by orjson, for the routes that answer with rows as they are.

Starlette's ``JSONResponse`` renders through the standard library's ``json.dumps``; for a batch
lookup's thousand entries that was a tenth of the request (docs/index-server.md#performance).
orjson writes the same JSON document: compact, UTF-8 (``ensure_ascii=False``), keys in the
order given, floats as the shortest text that reads back to the same double. The one place
the two differ, NaN and infinity (``json.dumps(allow_nan=False)`` raises, orjson writes
null), cannot arise: every float the index stores was refused at the door unless finite
(``allow_inf_nan=False`` on the request models in services/records.py).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
