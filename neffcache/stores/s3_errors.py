"""botocore's exceptions, turned into neffcache's one-line errors that say what to do.

Only this module knows botocore's exception zoo. A command never shows a traceback for the
three things operators hit first (no credentials, a missing bucket, a denied policy); a tier
chain treats every :class:`StoreUnavailable` as "this tier is down" and moves on.
"""

from __future__ import annotations

from typing import Any

from botocore import exceptions as bx

from neffcache.errors import AccessDenied, EntryNotFound, StoreError, StoreUnavailable

# Errors worth another attempt after botocore's own retries gave up: throttling, 5xx, and
# the connection dropping under us (operators report SlowDown throttling on PutObject during
# distributed runs: docs/runtimes.md, "What operators run into").
TRANSIENT_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed",
    "Throttling", "ThrottlingException", "ConditionalRequestConflict", "500", "502", "503", "504",
})
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    bx.ConnectionError, bx.HTTPClientError, bx.ResponseStreamingError, bx.IncompleteReadError,
    ConnectionError, TimeoutError,
)
_DENIED = frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem", "403"})
_BAD_CREDENTIALS = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"})
_EXPIRED = frozenset({"ExpiredToken", "TokenRefreshRequired", "RequestExpired"})
_WRONG_REGION = frozenset({"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"})


# A reply whose XML body got lost still has its status: name it like S3 would have.
_BY_STATUS = {"412": "PreconditionFailed", "503": "SlowDown"}


def error_code(exc: BaseException) -> str:
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code") or "")
        status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")
        if not code or code == status:
            return _BY_STATUS.get(status, status)
        return code
    return ""


def retry_attempts(exc: BaseException) -> int:
    """How often botocore retried before it raised ``exc`` (0 when unknown)."""
    if isinstance(exc, bx.ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)
    return 0


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, bx.ClientError):
        return error_code(exc) in TRANSIENT_CODES
    return isinstance(exc, NETWORK_ERRORS)


def is_not_found(exc: BaseException) -> bool:
    return error_code(exc) in ("NoSuchKey", "404", "NotFound")


def translate(exc: BaseException, *, url: str, bucket: str, endpoint: str | None, op: str,
              path: str | None = None) -> StoreError:
    """The neffcache error for a botocore failure of ``op`` (an S3 API name) on ``url``."""
    where: dict[str, Any] = {"store": url, "path": path}
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError | bx.CredentialRetrievalError
                  | bx.TokenRetrievalError | bx.SSOError):
        return StoreUnavailable(
            f"no usable AWS credentials for {url} ({exc}): set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, run `aws sso login`, or run on an instance with an IAM role", **where)
    if isinstance(exc, bx.NoRegionError):
        return StoreUnavailable(f"no AWS region for {url}: set AWS_REGION (e.g. us-east-1)", **where)
    if isinstance(exc, NETWORK_ERRORS):
        target = endpoint or "the S3 endpoint"
        return StoreUnavailable(
            f"cannot reach {target} for {url} during {op} ({type(exc).__name__}: {exc}); check the "
            "network and --endpoint-url / AWS_ENDPOINT_URL", **where)
    code = error_code(exc)
    message = ""
    if isinstance(exc, bx.ClientError):
        message = str(exc.response.get("Error", {}).get("Message") or "")
    if code == "NoSuchBucket":
        return StoreUnavailable(f"bucket {bucket!r} does not exist ({url}): create it "
                                f"(aws s3 mb s3://{bucket}) or fix the URL", **where)
    if code in _BAD_CREDENTIALS:
        return AccessDenied(f"the AWS credentials were rejected by {endpoint or 'S3'} ({code}) for {url}: "
                            "check AWS_PROFILE / AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", **where)
    if code in _EXPIRED:
        return AccessDenied(f"the AWS credentials for {url} have expired ({code}): refresh them "
                            "(aws sso login, or new session credentials)", **where)
    if code in _DENIED:
        return AccessDenied(
            f"access denied to {url} ({op}): the credentials need s3:ListBucket on arn:aws:s3:::{bucket} "
            f"and s3:GetObject/PutObject/DeleteObject on arn:aws:s3:::{bucket}/*", **where)
    if code in _WRONG_REGION:
        return StoreUnavailable(f"bucket {bucket!r} is in another region than the client's ({code}): "
                                "set AWS_REGION to the bucket's region", **where)
    if is_not_found(exc):
        return EntryNotFound(f"{path or url} not found in {url}", **where)
    if code in TRANSIENT_CODES:
        return StoreUnavailable(f"{url} kept failing with {code} during {op} after retries "
                                f"(S3 throttling or an outage): retry later or lower --parallel", **where)
    detail = f"{code}: {message}" if message else (code or f"{type(exc).__name__}: {exc}")
    return StoreError(f"S3 {op} on {url} failed: {detail}", **where)
