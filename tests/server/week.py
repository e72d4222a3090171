"""A realistic week of a fleet's compile-cache traffic, for the dashboard test and screenshots.

Story it tells: four teams, a cache that warms up over the week (hit rate climbing from ~55%
to ~90%), a compiler bump on day 4 that invalidates every trn2 entry (hit rate dips, compiles
spike, then the re-warm brings it back), a few failed and stale-locked entries, and a handful
of graphs that miss again and again.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from typing import Any

OLD = "2.26.8123.0+3b0c2e51"
NEW = "2.27.5334.0+f702b353"
TEAMS = {
    "search": ["llama3-8b", "llama3-70b"],
    "ads": ["bert-large", "dlrm-v2"],
    "speech": ["whisper-large-v3"],
    "research": ["mixtral-8x7b"],
}
INSTANCES = {"trn2": "trn2.48xlarge", "trn1": "trn1.32xlarge"}


@dataclass(frozen=True)
class Week:
    entries: list[dict[str, Any]]
    events: list[dict[str, Any]]


def _toolchain(version: str, target: str) -> dict[str, Any]:
    return {"compiler_version": version, "target": target, "lnc": 2 if target == "trn2" else 1}


def _namespace(tc: dict[str, Any]) -> str:
    return f"{tc['target']}-lnc{tc['lnc']}/neuronxcc-{tc['compiler_version']}"


def make_week(now: float, seed: int = 7, scale: float = 1.0) -> Week:
    rng = random.Random(seed)
    # Warm-ups draw from their own stream: the jobs' week stays the one the other tests know.
    ahead_rng = random.Random(seed + 1)
    start = now - 7 * 86400
    bump = start + 3.6 * 86400  # the compiler upgrade rolls out on day 4
    graphs: list[dict[str, Any]] = []
    for team, models in TEAMS.items():
        for model in models:
            target = "trn1" if model in ("bert-large", "whisper-large-v3") else "trn2"
            count = 60 if "70b" in model or "mixtral" in model else 35
            for g in range(count):
                graph_hash = rng.getrandbits(63)
                big = "70b" in model or "mixtral" in model
                graphs.append({
                    "team": team, "model": model, "target": target,
                    "key": f"MODULE_{graph_hash}+{rng.getrandbits(32):08x}",
                    "compile_seconds": rng.uniform(600, 2700) if big and g < 8 else rng.lognormvariate(4.2, 0.9),
                    "size": int(rng.uniform(40e6, 400e6) if big and g < 8 else rng.uniform(144e3, 17.5e6)),
                    "bucket": f"seq{rng.choice([512, 1024, 2048, 4096])}",
                })
    hot_misses = rng.sample(graphs, 6)

    entries: list[dict[str, Any]] = []
    for g in graphs:
        versions = [NEW] if g["target"] == "trn1" else [OLD, NEW]
        for version in versions:
            tc = _toolchain(version, g["target"])
            state = "SUCCESS"
            roll = rng.random()
            if roll < 0.02:
                state = "FAILED"
            elif roll < 0.028:
                state = "LOCKED"
            elif roll < 0.031:
                state = "CORRUPT"
            entries.append({
                "path": f"{_namespace(tc)}/{g['key']}", "layout": "neuronxcc", "key": g["key"],
                "namespace": _namespace(tc), "toolchain": tc, "state": state,
                "size": g["size"] if state == "SUCCESS" else int(g["size"] * 0.01),
                "neff_sha256": f"{rng.getrandbits(256):064x}" if state == "SUCCESS" else None,
                "store": "s3://ml-neff-cache/prod", "tags": {"team": g["team"], "model": g["model"],
                                                           "bucket": g["bucket"]},
                "created": start + rng.uniform(0, 7 * 86400), "producer": f"warm-{rng.randint(1, 4)}",
                "compile_seconds": g["compile_seconds"],
            })

    events: list[dict[str, Any]] = []
    for hour in range(7 * 24):
        t0 = start + hour * 3600
        local = (hour + 8) % 24  # a fleet busy in working hours, quieter at night
        load = (0.35 + 0.65 * math.exp(-((local - 14) ** 2) / 18)) * (0.6 if (hour // 24) % 7 in (5, 6) else 1.0)
        since_bump = (t0 - bump) / 3600
        warm = 0.55 + 0.37 * (1 - math.exp(-hour / 40))
        if 0 <= since_bump < 30:  # new compiler: trn2 entries miss until the re-warm catches up
            warm = 0.25 + (warm - 0.25) * (since_bump / 30) ** 1.5
        ahead = [("warm", g) for g in ahead_rng.sample(graphs, 4)] if local == 2 else []  # the nightly warm-up
        if 0 <= since_bump < 6:  # the rewarm of the stored HLOs right after the compiler bump
            ahead += [("rewarm", g) for g in ahead_rng.sample(graphs, 12) if g["target"] != "trn1"]
        for job, g in ahead:
            tc = _toolchain(NEW if (g["target"] == "trn1" or t0 >= bump) else OLD, g["target"])
            ts = min(now - 1, t0 + ahead_rng.uniform(0, 3600))
            common = {"path": f"{_namespace(tc)}/{g['key']}", "key": g["key"], "namespace": _namespace(tc),
                      "toolchain": tc, "job": job, "model": g["model"], "team": g["team"], "host": "warm-1",
                      "instance_type": INSTANCES[g["target"]], "store": None, "message": None}
            events.append({"id": uuid.uuid4().hex, "kind": "miss", "ts": ts, **common, "compile_seconds": None})
            events.append({"id": uuid.uuid4().hex, "kind": "compile", "ts": ts, **common,
                           "compile_seconds": g["compile_seconds"]})
        for _ in range(int(rng.gauss(90, 12) * load * scale)):
            g = rng.choice(hot_misses) if rng.random() < 0.04 else rng.choice(graphs)
            version = NEW if (g["target"] == "trn1" or t0 >= bump) else OLD
            tc = _toolchain(version, g["target"])
            path = f"{_namespace(tc)}/{g['key']}"
            hit = rng.random() < warm and g not in hot_misses
            ts = t0 + rng.uniform(0, 3600)
            if ts >= now:
                continue
            common = {"path": path, "key": g["key"], "namespace": _namespace(tc), "toolchain": tc,
                      "job": f"{g['model']}-train-{hour // 6}", "model": g["model"], "team": g["team"],
                      "host": f"ip-10-0-{rng.randint(0, 40)}-{rng.randint(1, 250)}",
                      "instance_type": INSTANCES[g["target"]], "store": None, "message": None}
            if hit:
                events.append({"id": uuid.uuid4().hex, "kind": "hit", "ts": ts, **common,
                               "compile_seconds": g["compile_seconds"]})
                continue
            events.append({"id": uuid.uuid4().hex, "kind": "miss", "ts": ts, **common, "compile_seconds": None})
            if rng.random() < 0.015:
                events.append({"id": uuid.uuid4().hex, "kind": "error", "ts": ts + 5, **common,
                               "compile_seconds": None, "message": "neuronx-cc exited 70: out of host memory"})
            else:
                events.append({"id": uuid.uuid4().hex, "kind": "compile", "ts": min(now - 1, ts + 1), **common,
                               "compile_seconds": g["compile_seconds"] * rng.uniform(0.9, 1.1)})
    return Week(entries=entries, events=events)
