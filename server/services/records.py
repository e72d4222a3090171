"""The records the services take and return: entries, events, leases, tokens (pydantic models).

The API serves them as they are, so every request model forbids unknown fields and every
string refuses control characters and lone surrogates (PostgreSQL rejects NUL in text, and a
value we cannot encode would otherwise surface as a 500 instead of a clear 422). They are the
server's side of :mod:`neffcache.index.records`, which the library sends.
"""

from __future__ import annotations

import functools
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from neffcache.errors import ConfigError
from neffcache.events import EventKind
from neffcache.index.records import MAX_LOOKUP_BATCH, MAX_RECORD_FLAG_LEN, MAX_RECORD_FLAGS
from neffcache.keys import safe_relpath
from neffcache.tags import MAX_INDEXED_TAGS, MAX_TAG_NAME, MAX_TAG_VALUE, TAG_NAME_PATTERN
from neffcache.toolchain import LAYOUT_NAMES, Toolchain

_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
Label = Annotated[str, StringConstraints(max_length=256, pattern=_PRINTABLE)]
ShortLabel = Annotated[str, StringConstraints(max_length=64, pattern=_PRINTABLE)]
StoreURL = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=_PRINTABLE)]
Message = Annotated[str, StringConstraints(max_length=8192, pattern=r"^[^\x00]*$")]
KeyStr = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.+=@,-]+$")]
EventId = Annotated[str, StringConstraints(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
TagName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TAG_NAME, pattern=TAG_NAME_PATTERN)]
TagValue = Annotated[str, StringConstraints(max_length=MAX_TAG_VALUE, pattern=_PRINTABLE)]
LeaseName = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")]
Owner = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
# Epoch seconds between 2000 and 2200: catches milliseconds and garbage alike.
Epoch = Annotated[float, Field(ge=946684800.0, le=7258118400.0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0.0, le=1e8, allow_inf_nan=False)]


# Cached: a batch of events names the same few namespaces and hot entries again and again.
# InvalidKey is a ValueError, which pydantic reports as a 422 (and lru_cache does not cache).
@functools.lru_cache(maxsize=65536)
def _relpath(value: str) -> str:
    return safe_relpath(value)


def _namespace(value: str) -> str:
    return _relpath(value) if value else value


RelPath = Annotated[str, StringConstraints(min_length=1, max_length=1024), AfterValidator(_relpath)]
# The single path components GET /v1/entries/<name> answers itself (see api/routes/entries.py):
# no layout names an entry with one component, and an entry may not take one, or its single
# lookup would reach the query instead of the entry.
RESERVED_PATHS = frozenset({"lookup", "similar", "compile-samples"})


def _entry_path(value: str) -> str:
    if value in RESERVED_PATHS:
        raise ValueError(f"entry path {value!r} is reserved for the API; an entry path has a namespace")
    return value


EntryPath = Annotated[RelPath, AfterValidator(_entry_path)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# A user flag as the runtime passes it on a command line: bounded, no NUL (which no argv holds).
Flag = Annotated[str, StringConstraints(max_length=MAX_RECORD_FLAG_LEN, pattern=r"^[^\x00]*$")]
Namespace = Annotated[str, StringConstraints(max_length=512), AfterValidator(_namespace)]
def _layout(value: str) -> str:
    if value not in LAYOUT_NAMES:
        raise ValueError(f"unknown layout {value!r}; known: {', '.join(LAYOUT_NAMES)}")
    return value


Layout = Annotated[str, AfterValidator(_layout)]  # a name in the library's registry
State = Literal["SUCCESS", "FAILED", "LOCKED", "EMPTY", "CORRUPT"]
Scope = Literal["read", "write", "admin"]
STATES: tuple[str, ...] = ("SUCCESS", "FAILED", "LOCKED", "EMPTY", "CORRUPT")
UNKNOWN_TOOLCHAIN = "unknown"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolchainIn(Strict):
    compiler_version: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    target: Annotated[str, StringConstraints(min_length=1, max_length=16)]
    lnc: Annotated[int, Field(ge=1, le=2)]

    @model_validator(mode="after")
    def _valid(self) -> ToolchainIn:
        try:  # one definition of a valid toolchain: the library's
            _namespace_dir(self.compiler_version, self.target, self.lnc)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def label(self) -> str:
        # The same string as the namespace directory, so charts and paths read alike.
        return _namespace_dir(self.compiler_version, self.target, self.lnc)


# Cached: every event of a batch names a toolchain, nearly always one of a handful, and building
# the library's Toolchain (which checks the version) twice per event was a tenth of an ingest.
# A refused toolchain raises ConfigError, which lru_cache does not cache.
@functools.lru_cache(maxsize=1024)
def _namespace_dir(compiler_version: str, target: str, lnc: int) -> str:
    return Toolchain(compiler_version, target, lnc).namespace_dir


def toolchain_label(toolchain: ToolchainIn | None) -> str:
    return toolchain.label if toolchain is not None else UNKNOWN_TOOLCHAIN


class EntryIn(Strict):
    """What a client registers when it publishes an entry to a store."""

    path: EntryPath
    layout: Layout
    key: KeyStr
    namespace: Namespace = ""
    toolchain: ToolchainIn | None = None
    state: State
    size: Annotated[int, Field(ge=0, le=2**62)]
    neff_sha256: Sha256 | None = None
    store: StoreURL
    tags: Annotated[dict[TagName, TagValue], Field(max_length=MAX_INDEXED_TAGS)] = Field(default_factory=dict)
    created: Epoch
    producer: Label = ""
    compile_seconds: Seconds | None = None
    # Optional: older clients send none of these, and a registration without them never
    # erases what an earlier registration of the entry said (see catalog.register_entries).
    hlo_sha256: Sha256 | None = None
    hlo_size: Annotated[int, Field(ge=0, le=2**62)] | None = None
    flags: Annotated[list[Flag], Field(max_length=MAX_RECORD_FLAGS)] | None = None


class EntryOut(BaseModel):
    path: str
    layout: str
    key: str
    namespace: str
    toolchain: dict[str, object] | None
    toolchain_label: str
    state: str
    size: int
    neff_sha256: str | None
    stores: list[str]
    tags: dict[str, str]
    created: float
    registered: float
    updated: float
    producer: str
    compile_seconds: float | None
    hlo_sha256: str | None = None
    hlo_size: int | None = None
    flags: list[str] | None = None
    hit_count: int  # the usage stamps last, as every lookup renders them (services/rendering.py)
    last_used: float | None


class LookupRequest(Strict):
    paths: Annotated[list[RelPath], Field(max_length=MAX_LOOKUP_BATCH, description=(
        f"entry paths, at most {MAX_LOOKUP_BATCH}; repeats are answered once"))]


class LookupResult(BaseModel):
    found: list[EntryOut] = Field(description="the entries the index has, in the order asked")
    missing: list[str] = Field(description="the paths it has no entry for, in the order asked")


class SimilarEntries(BaseModel):
    entries: list[EntryOut] = Field(description="newest first")


class CompileSampleOut(BaseModel):
    hlo_size: int
    compile_seconds: float
    compiler_version: str | None
    hlo_sha256: str | None


class CompileSamples(BaseModel):
    samples: list[CompileSampleOut] = Field(description="newest first")


class EntryPage(BaseModel):
    entries: list[EntryOut]
    next_cursor: int | None = Field(description="pass as ?cursor= to get the next page; null on the last")


class ForgetResult(BaseModel):
    path: str
    removed_stores: int
    entry_removed: bool


class EventIn(Strict):
    id: EventId = Field(description="client-generated unique id; resending an event with the same id is a no-op")
    kind: EventKind
    ts: Epoch
    path: RelPath | None = None
    key: KeyStr | None = None
    namespace: Namespace = ""
    toolchain: ToolchainIn | None = None
    job: Label = ""
    model: Label = ""
    team: Label = ""
    host: Label = ""
    instance_type: ShortLabel = ""
    compile_seconds: Seconds | None = Field(
        default=None, description="compile: seconds spent; hit: seconds the hit saved")
    store: StoreURL | None = None
    message: Message | None = None


class LeaseOut(BaseModel):
    held: bool = Field(description="acquire/renew: whether the requester holds the lease now; "
                             "lookups and listings: whether anyone holds it")
    name: str
    owner: str | None = Field(description="the current holder's label (the requester's when held)")
    writer: str | None = Field(default=None, description="the token that holds it: the holder is this token "
                                                         "and owner together")
    acquired_at: float | None
    expires_at: float | None
    expires_in: float | None = Field(description="seconds left, from the database clock")


# ``owner`` labels the requesting process among those sharing its token; who holds a lease is
# the token first (services/leases.py), so a label is no credential.
_OWNER_DOC = "a label of the requesting process (host:pid:random); the holder is the token and this label"


class LeaseAcquire(Strict):
    name: LeaseName
    owner: Owner = Field(default="-", description=_OWNER_DOC)
    ttl: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 600.0


class LeaseRelease(Strict):
    name: LeaseName
    owner: Owner = Field(default="-", description=_OWNER_DOC)


class TokenCreate(Strict):
    name: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@:-]*$")]
    scope: Scope
    team: Label = Field(default="", description="the team its events count for; none if empty")
    prefixes: Annotated[list[StoreURL], Field(max_length=32)] = Field(
        default_factory=list, description="entry-path or store-URL prefixes it may write under; anywhere if none")
