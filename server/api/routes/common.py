"""Query-parameter types and error responses shared by the routers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import HTTPException, Query, status

from neffcache.errors import InvalidKey
from neffcache.keys import safe_relpath
from neffcache.server.api.schemas import Problem

_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
# Every free-text query parameter is bounded and printable: PostgreSQL refuses NUL in text, and
# that must be a 422 here, not a 500 from the driver.
QText = Annotated[str | None, Query(max_length=1024, pattern=_PRINTABLE)]

AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no token, or an invalid or revoked one"},
    403: {"model": Problem, "description": "the token lacks the scope"},
}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    413: {"model": Problem, "description": "body larger than the server's limit"},
}


def checked_path(path: str) -> str:
    """A store-relative path from a URL, refused with 422 if it could escape a store root."""
    try:
        return safe_relpath(path)
    except InvalidKey as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None


def not_found(what: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"{what} not found")
