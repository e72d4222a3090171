"""Upgrade readiness for a pair of toolchains, computed from the catalog and the hit events.

The same number ``neffcache upgrade-report`` prints (the rule: :mod:`neffcache.readiness`), for
the dashboard and ``/metrics``, with no table of its own: nothing is stored, so nothing needs a
migration and no replica holds a number the others lack. The old graphs are the catalog's
SUCCESS entries of the old toolchain label; a graph is ready when the new label has a SUCCESS
entry of the same layout that is the same key, or that ``neffcache rewarm`` tagged as compiled
from it (``rewarmed_from``). The report reads the stores and names every successor exactly; the
server reads what clients registered, so it sees no failed successor (rewarm registers only what
it published) and no entry warmed directly into the new namespace under a new name: those count
as missing here, and the report, which runs the gate, is the authority.

Which pairs: any, as ``from``/``to`` labels; by default, per target and LNC, the newest compiler
in the catalog against the one before it (a shadow rewarm's target against what the jobs run).
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel
from sqlalchemy import case, exists, func, or_, select
from sqlalchemy.orm import Session, aliased

from neffcache.events import EventKind
from neffcache.readiness import REWARMED_FROM_TAG, UNUSED_WEIGHT, readiness
from neffcache.server.storage.models import Entry, EntryTag, Event
from neffcache.toolchain import version_key

MAX_PAIRS = 12


class MissingGraph(BaseModel):
    path: str
    hits: int


class ReadinessOut(BaseModel):
    from_toolchain: str
    to_toolchain: str
    since: float
    until: float
    graphs: int
    ready_graphs: int
    hits: int
    ready_hits: int
    readiness: float | None
    unused_weight: float = UNUSED_WEIGHT
    missing: list[MissingGraph]


def pair_readiness(session: Session, from_label: str, to_label: str, since: float, until: float, *,
                   top: int = 10) -> ReadinessOut:
    """Readiness of switching from ``from_label`` to ``to_label`` (toolchain labels), hits counted
    in ``[since, until)``, with the ``top`` most hit graphs still missing."""
    old, new = aliased(Entry), aliased(Entry)
    hits = (select(Event.path.label("path"), func.count().label("n"))
            .where(Event.kind == EventKind.HIT, Event.ts >= since, Event.ts < until, Event.toolchain == from_label)
            .group_by(Event.path).subquery())
    # Two levels deep: correlate to both entries explicitly (automatic correlation stops one level up).
    tagged = (exists().where(EntryTag.entry_id == new.id, EntryTag.name == REWARMED_FROM_TAG,
                             EntryTag.value == old.key).correlate_except(EntryTag))
    ready = exists().where(new.toolchain == to_label, new.state == "SUCCESS", new.layout == old.layout,
                           or_(new.key == old.key, tagged))
    graphs = (select(old.path.label("path"), func.coalesce(hits.c.n, 0).label("hits"),
                     case((ready, 1), else_=0).label("ready"))
              .select_from(old).outerjoin(hits, hits.c.path == old.path)
              .where(old.toolchain == from_label, old.state == "SUCCESS").subquery())
    sums = {int(flag): (int(n), int(h or 0)) for flag, n, h in session.execute(
        select(graphs.c.ready, func.count(), func.sum(graphs.c.hits)).group_by(graphs.c.ready))}
    missing = [MissingGraph(path=str(p), hits=int(h)) for p, h in session.execute(
        select(graphs.c.path, graphs.c.hits).where(graphs.c.ready == 0)
        .order_by(graphs.c.hits.desc(), graphs.c.path).limit(top))]
    (n_ready, h_ready), (n_missing, h_missing) = sums.get(1, (0, 0)), sums.get(0, (0, 0))
    return ReadinessOut(from_toolchain=from_label, to_toolchain=to_label, since=since, until=until,
                        graphs=n_ready + n_missing, ready_graphs=n_ready, hits=h_ready + h_missing,
                        ready_hits=h_ready,
                        readiness=readiness(n_ready + n_missing, h_ready + h_missing, n_ready, h_ready),
                        missing=missing)


def upgrade_pairs(session: Session, limit: int = MAX_PAIRS) -> list[tuple[str, str]]:
    """(from, to) labels: per target and LNC with two compilers or more among the SUCCESS entries,
    the one before the newest, and the newest (by :func:`neffcache.toolchain.version_key`)."""
    versions: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    for target, lnc, version, label in session.execute(
        select(Entry.target, Entry.lnc, Entry.compiler_version, Entry.toolchain).distinct()
        .where(Entry.state == "SUCCESS", Entry.compiler_version.is_not(None), Entry.target.is_not(None),
               Entry.lnc.is_not(None)).limit(10_000)
    ):
        if lnc is not None:  # never None here (the query says so); for the type checker
            versions[(str(target), lnc)][str(version)] = str(label)
    pairs = []
    for group in sorted(versions):
        labels = versions[group]
        if len(labels) >= 2:
            older, newest = sorted(labels, key=version_key)[-2:]
            pairs.append((labels[older], labels[newest]))
    return pairs[:limit]
