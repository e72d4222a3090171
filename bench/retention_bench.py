"""Retention benchmark: recompute seconds lost and hit rate of LRU, GDSF and neffcache's value
policy, replaying seeded synthetic traces at budgets of 10-50% of the working set.

    .venv/bin/python -m bench.retention_bench                       # the table of docs/performance.md
    .venv/bin/python -m bench.retention_bench --requests 20000 --budgets 20   # a quick look

No trace of a real compile cache with miss costs is public (Caffeine's maintainers say so), so
the traces are generated, and every parameter is printed with the result. Per compiler
generation, ``--graphs`` graphs with log-normal compile times and sizes whose logs correlate at
``--correlation`` (kache measured 0.73 on a real 51k-entry cache); requests pick graphs by
Zipf popularity (a random permutation of ranks, so popularity is independent of cost);
periodic jobs request their own random graphs all at once every day or week; a compiler bump
every ``bump days`` starts a new generation whose keys are all new.

Each trace is replayed through an online cache per policy: a miss compiles and inserts, then
entries are evicted until the bytes held are within the budget. ``lru`` is recency alone;
``gdsf`` is Greedy-Dual-Size-Frequency with its inflation clock (the reference); ``value`` is
:mod:`neffcache.prune.value`, the order ``prune --max-size`` uses, kept in a heap by
:func:`~neffcache.prune.value.rank` (its order does not change with time; at a compiler bump
every held entry becomes superseded and is ranked again). *Recompute
seconds lost* are the compile seconds of misses on graphs the cache had held before (the
first compile of a graph is paid under every policy and left out); the hit rate counts every
request. Goal (issue 40): ``value`` loses at least 30% fewer recompute seconds than ``lru`` at
each budget of each trace, with a hit rate at most 2 points lower.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace

from neffcache.prune.value import ValuePolicy, rank

DAY = 86400.0
MIB = 1 << 20


@dataclass(frozen=True)
class TraceSpec:
    """The generator's parameters: everything a trace depends on, printed with its results."""

    name: str
    seed: int = 40
    graphs: int = 4000  # distinct graphs per compiler generation
    requests: int = 100_000  # background (Zipf) requests over the whole trace
    days: float = 28.0
    zipf: float = 0.9
    compile_median: float = 45.0  # seconds
    compile_sigma: float = 1.5  # of ln(seconds): 2 s .. 30 min within two sigmas
    size_median: float = 8.0 * MIB
    size_sigma: float = 1.2
    correlation: float = 0.7  # of ln(size) with ln(compile seconds)
    jobs: int = 0  # periodic jobs
    job_graphs: int = 150  # graphs each job needs per run
    bump_days: float | None = None  # a compiler bump every this many days


@dataclass(frozen=True)
class Graph:
    size: int
    seconds: float


@dataclass
class Trace:
    spec: TraceSpec
    graphs: list[Graph]  # per graph index (shared by every generation)
    requests: list[tuple[float, int, int]] = field(default_factory=list)  # (time, generation, graph)

    @property
    def log_log_correlation(self) -> float:
        xs = [math.log(g.seconds) for g in self.graphs]
        ys = [math.log(g.size) for g in self.graphs]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        return cov / math.sqrt(sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys))


def generate(spec: TraceSpec) -> Trace:
    rng = random.Random(spec.seed)
    graphs = []
    for _ in range(spec.graphs):
        zc, zn = rng.gauss(0, 1), rng.gauss(0, 1)
        seconds = spec.compile_median * math.exp(spec.compile_sigma * zc)
        zs = spec.correlation * zc + math.sqrt(1 - spec.correlation ** 2) * zn
        graphs.append(Graph(max(int(spec.size_median * math.exp(spec.size_sigma * zs)), 4096), seconds))
    trace = Trace(spec, graphs)
    span = spec.days * DAY
    ranks = list(range(spec.graphs))
    rng.shuffle(ranks)  # popularity rank -> graph: independent of cost and size
    weights = [1.0 / (r + 1) ** spec.zipf for r in range(spec.graphs)]
    cum = list(_accumulate(weights))
    times = sorted(rng.uniform(0, span) for _ in range(spec.requests))
    picks = rng.choices(ranks, cum_weights=cum, k=spec.requests)
    events = [(t, g) for t, g in zip(times, picks, strict=True)]
    for _ in range(spec.jobs):
        period = rng.choice((DAY, 7 * DAY))
        mine = rng.sample(range(spec.graphs), spec.job_graphs)
        t = rng.uniform(0, period)
        while t < span:
            events.extend((t + i * 1.0, g) for i, g in enumerate(mine))
            t += period
    events.sort()
    bump = spec.bump_days * DAY if spec.bump_days else None
    trace.requests = [(t, int(t // bump) if bump else 0, g) for t, g in events]
    return trace


def _accumulate(values: list[float]) -> Iterator[float]:
    total = 0.0
    for v in values:
        total += v
        yield total


@dataclass
class Slot:
    """One cached entry, as :mod:`neffcache.prune.value` sees it."""

    size: int
    compile_seconds: float | None
    hits: int
    used: float
    version: int = 0


@dataclass
class Outcome:
    policy: str
    budget: float
    requests: int = 0
    hits: int = 0
    lost_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0


POLICIES = ("lru", "gdsf", "value")
# --ablation: how much of value's gain is the compiler-bump rule (lru+bump: LRU that evicts
# superseded entries first; value-bump: value without that rule).
ABLATION = ("lru+bump", "value-bump")
BUMP_AWARE = ("value", "lru+bump")


def priority(policy: str, slot: Slot, superseded: bool, clock: float, value: ValuePolicy) -> tuple[int, float]:
    """A heap policy's key for ``slot``, smallest evicted first."""
    if policy == "value":
        return rank(slot, value, superseded=superseded)
    if policy == "value-bump":
        return rank(slot, value)
    if policy == "lru+bump":
        return (0 if superseded else 1), slot.used
    # gdsf: L + F x C / S (cost per byte, as GDSF's paper)
    return 1, clock + (1 + slot.hits) * (slot.compile_seconds or 0.0) / slot.size


def replay(trace: Trace, policy: str, fraction: float, budget: int, value: ValuePolicy) -> Outcome:
    """Replay ``trace`` through an online cache of ``budget`` bytes (``fraction`` of the working
    set) evicting by ``policy``."""
    out = Outcome(policy, fraction)
    held: dict[tuple[int, int], Slot] = {}
    order: OrderedDict[tuple[int, int], None] = OrderedDict()  # lru
    # gdsf, value: (not superseded, priority, -size, version, key); stale records are skipped
    heap: list[tuple[int, float, int, int, tuple[int, int]]] = []
    seen: set[tuple[int, int]] = set()
    clock = 0.0  # gdsf's inflation value L
    total = 0
    stamp = 0
    newest = 0  # the newest compiler generation asked for so far

    def push(key: tuple[int, int], slot: Slot) -> None:
        nonlocal stamp
        stamp += 1
        slot.version = stamp
        fresh, prio = priority(policy, slot, key[0] < newest, clock, value)
        heapq.heappush(heap, (fresh, prio, -slot.size, stamp, key))

    for t, gen, g in trace.requests:
        key = (gen, g)
        if gen > newest:
            newest = gen
            if policy in BUMP_AWARE:  # a compiler bump: every held entry is now superseded
                for k, sl in list(held.items()):
                    push(k, sl)
        out.requests += 1
        slot = held.get(key)
        if slot is not None:
            out.hits += 1
            slot.hits += 1
            slot.used = t
            if policy == "lru":
                order.move_to_end(key)
            else:
                push(key, slot)
            continue
        graph = trace.graphs[g]
        if key in seen:
            out.lost_seconds += graph.seconds
        seen.add(key)
        if graph.size > budget:
            continue
        slot = Slot(graph.size, graph.seconds, 0, t)
        held[key] = slot
        total += slot.size
        if policy == "lru":
            order[key] = None
        else:
            push(key, slot)
        while total > budget:
            if policy == "lru":
                victim, _ = order.popitem(last=False)
            else:
                _, prio, _, version, victim = heapq.heappop(heap)
                if victim not in held or held[victim].version != version:
                    continue  # a stale heap record: the entry was re-pushed or is gone
                clock = prio if policy == "gdsf" else clock
            total -= held.pop(victim).size
    return out


def working_set(trace: Trace, keys: set[tuple[int, int]]) -> int:
    """The bytes of the largest compiler generation's distinct keys: what a cache must hold to
    stop missing once warm (an old generation's keys are never asked for again)."""
    per: dict[int, int] = {}
    for gen, g in keys:
        per[gen] = per.get(gen, 0) + trace.graphs[g].size
    return max(per.values())


def run(spec: TraceSpec, fractions: list[float], value: ValuePolicy, policies: tuple[str, ...]) -> list[Outcome]:
    trace = generate(spec)
    keys = {(gen, g) for _, gen, g in trace.requests}
    ws = working_set(trace, keys)
    print(f"\ntrace {spec.name}: {len(trace.requests)} requests, {len(keys)} distinct keys, working set "
          f"{ws / 2**30:.1f} GiB, log-log correlation of size and compile time {trace.log_log_correlation:.2f}")
    print("  parameters: " + ", ".join(f"{k}={v}" for k, v in asdict(spec).items() if k != "name"))
    results: list[Outcome] = []
    print(f"  {'budget':>6}  {'policy':<10} {'hit rate':>8} {'recompute h lost':>16} {'vs lru':>7}")
    for fraction in fractions:
        budget = int(ws * fraction)
        row = {p: replay(trace, p, fraction, budget, value) for p in policies}
        base = row["lru"].lost_seconds
        for name, o in row.items():
            vs = f"{(o.lost_seconds - base) / base:+.0%}" if base else "-"
            print(f"  {fraction:>6.0%}  {name:<10} {o.hit_rate:>8.1%} {o.lost_seconds / 3600:>16.1f} {vs:>7}")
        results.extend(row.values())
    return results


TRACES = (
    TraceSpec("zipf"),
    TraceSpec("periodic", jobs=12),
    TraceSpec("bumps", bump_days=10.0),
    TraceSpec("mixed", jobs=12, bump_days=10.0),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=",".join(t.name for t in TRACES),
                        help=f"Comma-separated traces ({', '.join(t.name for t in TRACES)}).")
    parser.add_argument("--budgets", default="10,20,30,40,50", help="Budgets, percent of the working set.")
    parser.add_argument("--requests", type=int, default=None, help="Background requests per trace.")
    parser.add_argument("--graphs", type=int, default=None, help="Distinct graphs per compiler generation.")
    parser.add_argument("--seed", type=int, default=None, help="The generator's seed.")
    parser.add_argument("--correlation", type=float, default=None, help="Log-log correlation of size and time.")
    parser.add_argument("--ablation", action="store_true",
                        help="Also replay lru+bump and value-bump: what the compiler-bump rule alone is worth.")
    parser.add_argument("--half-life-days", type=float, default=7.0, help="The value policy's half-life.")
    args = parser.parse_args()
    chosen = {name.strip() for name in args.traces.split(",") if name.strip()}
    unknown = chosen - {t.name for t in TRACES}
    if unknown:
        parser.error(f"unknown trace(s): {', '.join(sorted(unknown))}")
    try:
        fractions = [float(p) / 100 for p in args.budgets.split(",") if p.strip()]
    except ValueError:
        parser.error(f"--budgets takes percentages such as 10,20,50, not {args.budgets!r}")
    if not fractions or not all(0 < f <= 1 for f in fractions):
        parser.error("--budgets are percentages in (0, 100]")
    overrides = {k: v for k, v in (("requests", args.requests), ("graphs", args.graphs), ("seed", args.seed),
                                   ("correlation", args.correlation)) if v is not None}
    value = ValuePolicy(half_life=args.half_life_days * DAY)
    print(f"value policy: half-life {args.half_life_days:g} days; goal: >=30% fewer recompute seconds than lru, "
          "hit rate at most 2 points lower")
    started = time.perf_counter()
    verdicts = []
    for base in TRACES:
        if base.name in chosen:
            spec = replace(base, **overrides)
            policies = POLICIES + (ABLATION if args.ablation else ())
            verdicts.append(_verdict(spec, run(spec, fractions, value, policies), fractions))
    print()
    print("\n".join(verdicts))
    print(f"({time.perf_counter() - started:.1f}s)")


def _verdict(spec: TraceSpec, results: list[Outcome], fractions: list[float]) -> str:
    misses = []
    for fraction in fractions:
        by = {o.policy: o for o in results if o.budget == fraction}
        lru, value = by["lru"], by["value"]
        saved = 1 - value.lost_seconds / lru.lost_seconds if lru.lost_seconds else 1.0
        points = (lru.hit_rate - value.hit_rate) * 100
        if saved < 0.30 or points > 2.0:
            misses.append(f"{fraction:.0%}: {saved:.0%} fewer seconds, hit rate {-points:+.1f} points")
    if not misses:
        return f"{spec.name}: goal met at every budget"
    return f"{spec.name}: goal NOT met at " + "; ".join(misses)


if __name__ == "__main__":
    main()
