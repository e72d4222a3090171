"""The likely cause of a miss and what would have hit, one line each, and the whole answer.

:func:`explain` compares the missed graph with every candidate (:func:`~.explain.compare`),
ranks them (:func:`~.explain.nearest`) and words the nearest one's differences: one fragment
per differing field, in the order that decides the fix (an entry of another HLO, layout,
target or LNC can only be replaced by a warm-up; another compiler by a rewarm; other flags by
rerunning with the entry's). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neffcache.instances import CATALOG
from neffcache.misses.explain import Comparison, Field, Match, Missed, NearEntry, compare, nearest
from neffcache.misses.flagdiff import FlagDiff
from neffcache.misses.inputs import ReportedStatus

WORKLOAD = "<your workload>"
MODEL_TAG = "model"


@dataclass(frozen=True)
class Explanation:
    """Why one graph missed: the nearest entries (closest first), the cause and the fix.

    ``held``: stores that hold the very entry the job looked for (then it was no miss there, or
    it has been compiled since); ``searched``: the stores looked at; ``index``: what the index
    was asked and said (or why it was not asked)."""

    missed: Missed
    comparisons: tuple[Comparison, ...]
    cause: str
    fix: str
    held: tuple[str, ...] = ()
    searched: tuple[str, ...] = ()
    index: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"missed": self.missed.to_json(), "cause": self.cause, "fix": self.fix, "held": list(self.held),
                "searched": list(self.searched), "index": self.index,
                "nearest": [c.to_json() for c in self.comparisons]}


def _short(found: str, wanted: str) -> tuple[str, str]:
    """Two compiler versions as people say them (2.21, 2.22) when that tells them apart."""
    a, b = (".".join(v.split("+", 1)[0].split(".")[:2]) for v in (found, wanted))
    return (a, b) if a != b else (found, wanted)


def instance_for(target: str | None, asked: str | None = None) -> str:
    """The instance type of ``target`` a fix's command line names: ``asked`` (the instance the
    user asked about) when it is one, else the target's largest (most NeuronCores: what a
    training fleet runs; the smallest would warm for an instance nobody asked about)."""
    row = CATALOG.get(asked or "")
    if row is not None and row.target == target:
        return row.name
    rows = [row for row in CATALOG.values() if row.target == target and row.verified]
    return min(rows, key=lambda r: (-r.neuron_cores, r.name)).name if rows else "<instance>"


def _flag_cause(diff: FlagDiff | None) -> str:
    if diff is None:
        return "flags differ: the key is not the one this entry's flags give"
    paths = diff.path_flags()
    if paths:
        how = ("added" if any(f.name == paths[0] for f in diff.added)
               else "removed" if any(f.name == paths[0] for f in diff.removed) else "differs")
        return f"flag `{paths[0]}=...` {how}: a path in the flags changes the key"
    if diff.reordered:
        return "the same flags in another order: the key hashes them as written"
    words = [f"`{f.spelling}` added" for f in diff.added] + [f"`{f.spelling}` removed" for f in diff.removed]
    words += [f"`{c.name}` spelled `{c.found}` vs `{c.wanted}`" if c.same_value else f"`{c.found}` → `{c.wanted}`"
              for c in diff.changed]
    if len(words) == 1 and diff.changed and not diff.changed[0].same_value:
        change = diff.changed[0]
        return f"flag `{change.name}` changed: `{change.found}` → `{change.wanted}`"
    if len(words) == 1:
        return f"flag {words[0]}"
    return "flags differ: " + ", ".join(words[:3]) + (f" and {len(words) - 3} more" if len(words) > 3 else "")


def _fragments(comparison: Comparison) -> list[tuple[Field, str]]:
    """One phrase per differing field, in the order that decides the fix."""
    by_field = {d.field: d for d in comparison.differences if d.match is Match.DIFFERENT}
    out: list[tuple[Field, str]] = []
    if Field.HLO in by_field:
        tag = comparison.candidate.parts.tags.get(MODEL_TAG)
        return [(Field.HLO, "the graph changed: another HLO" + (f" under the same model tag `{MODEL_TAG}={tag}`"
                                                                  if tag else ""))]
    for name, word in ((Field.LAYOUT, "layout"), (Field.TARGET, "target"), (Field.LNC, "LNC")):
        if name in by_field:
            out.append((name, f"{word} {by_field[name].found} vs {by_field[name].wanted}"))
    if Field.COMPILER in by_field:
        old, new = _short(by_field[Field.COMPILER].found or "?", by_field[Field.COMPILER].wanted or "?")
        out.append((Field.COMPILER, f"compiler {old} → {new}"))
    if Field.KEY_RULE in by_field:
        same = comparison.match(Field.FLAGS) is Match.SAME
        rule = by_field[Field.KEY_RULE]
        out.append((Field.KEY_RULE, f"flags-file form {rule.found} → {rule.wanted}"
                    + (" (same flags, new suffix)" if same else "")))
    if Field.FLAGS in by_field:
        out.append((Field.FLAGS, _settings_cause(comparison) or _flag_cause(comparison.flags)))
    return out


def _settings_cause(comparison: Comparison) -> str | None:
    """The job settings behind the differing flags, when the layout splits its flags into
    several (TorchNeuron: the opt level and NEURON_CC_FLAGS; :func:`~.explain.compare`)."""
    named = [(name, found, wanted) for name, found, wanted in comparison.settings if found != wanted]
    if not named:
        return None
    return "; ".join(f"{name} `{found or '(unset)'}` → `{wanted or '(unset)'}`" for name, found, wanted in named) \
        + f": part of every {comparison.candidate.parts.layout or 'runtime'} key"


def _where(candidate: NearEntry) -> str:
    return f" --store {candidate.stores[0]}" if candidate.stores else ""


def _wanted(comparison: Comparison, name: Field) -> str | None:
    return next((d.wanted for d in comparison.differences if d.field is name), None)


def _fix(comparison: Comparison, fields: set[Field], asked: str | None = None) -> str:
    cand = comparison.candidate
    target, lnc = _wanted(comparison, Field.TARGET), _wanted(comparison, Field.LNC)
    warm = f"neffcache warm --instance {instance_for(target, asked)}"
    if Field.HLO in fields:
        return f"nothing stored could have hit: warm the new graph: {warm} -- {WORKLOAD}"
    if Field.LAYOUT in fields:
        return f"warm it for the job's runtime: {warm} -- {WORKLOAD}"
    if Field.TARGET in fields:
        return (f"a NEFF for {cand.parts.target} cannot serve {target}: run the job on a {cand.parts.target} "
                f"instance, or warm for {target}: {warm} -- {WORKLOAD}")
    if Field.LNC in fields:
        return (f"run the job with LNC {cand.parts.lnc} to use {cand.path}, or warm for LNC {lnc}: "
                f"{warm} --lnc {lnc} -- {WORKLOAD}")
    fixes = []
    if Field.FLAGS in fields:
        flags = f": `{shlex.join(cand.parts.flags)}`" if cand.parts.flags is not None else ""
        paths = "keep per-run paths out of the compiler flags, then " if comparison.flags is not None \
            and comparison.flags.path_flags() else ""
        if _settings_cause(comparison) is not None:
            fixes.append(f"rerun with the settings entry {cand.path} was compiled under: "
                         + " ".join(f"{name}={shlex.quote(found)}" for name, found, _ in comparison.settings))
        else:
            fixes.append(f"{paths}rerun with the flags of entry {cand.path}{flags}")
    form = _wanted(comparison, Field.KEY_RULE)
    if Field.COMPILER in fields:
        version = cand.parts.compiler_version
        rule = (f" (it names the entry in the job's flags form, {form})" if Field.KEY_RULE in fields else "")
        instance = f" --instance {instance_for(target, asked)}" if target else ""
        fixes.append(f"use compiler {version} (the entry's), or rewarm: "
                     f"neffcache rewarm --from-compiler {version}{instance}{_where(cand)}{rule}")
    elif Field.KEY_RULE in fields:
        fixes.append(f"the entry is named in another flags form than the job's runtime keys by ({form}): "
                     f"compile it again under that form (`neffcache rewarm --flags-form {form}` from an older "
                     f"compiler's entries), or warm it with the job's runtime: neffcache warm -- {WORKLOAD}")
    if not fixes:
        where = f" in {cand.stores[0]}" if cand.stores else ""
        return (f"entry {cand.path}{where} has every known part of the graph: point the job at it "
                f"(`neffcache env --store URL`) or copy it where the job looks (`neffcache pull`)")
    return "; ".join(fixes)


# The entry the job looked for is there, but not as a NEFF the runtime serves: its state is the cause.
_STATE_CAUSES = {
    "FAILED": ("the entry itself is FAILED: a cached compiler failure, which the runtime skips",
               f"recompile it: neffcache warm --retry-failed --instance {{instance}} -- {WORKLOAD}"),
    "LOCKED": ("the entry itself is LOCKED: a compile holds it, or died holding it (a stale lock)",
               "if no compile runs: neffcache prune --stale-locks --store URL"),
    "EMPTY": ("the entry itself is EMPTY: its HLO was extracted, never compiled",
              f"compile it: neffcache warm --instance {{instance}} -- {WORKLOAD}"),
    "CORRUPT": ("the entry itself is CORRUPT: its files contradict each other or their manifest",
                "quarantine it and compile it again: neffcache verify --fix URL"),
}


def word(comparison: Comparison, missed: Missed, asked: str | None = None) -> Comparison:
    """``comparison`` with its cause and fix (``asked``: the instance type the user asked about)."""
    cand = comparison.candidate
    if cand.path == missed.path and cand.state in _STATE_CAUSES:
        cause, fix = _STATE_CAUSES[cand.state]
        return dataclasses.replace(comparison, cause=cause,
                                   fix=fix.format(instance=instance_for(cand.parts.target, asked)))
    fragments = _fragments(comparison)
    cause = "; ".join(text for _, text in fragments)
    if not fragments:
        unknown = [d.field.value for d in comparison.differences if d.match is Match.UNKNOWN]
        cause = "no known part differs" + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        if missed.path and comparison.candidate.path != missed.path:
            cause += f": the same graph lies at {comparison.candidate.path}"
    return dataclasses.replace(comparison, cause=cause, fix=_fix(comparison, {f for f, _ in fragments}, asked))


def explain(missed: Missed, candidates: Sequence[NearEntry], *, held: Sequence[str] = (),
            searched: Sequence[str] = (), index: str = "", instance: str | None = None) -> Explanation:
    """The answer for one missed graph: every candidate compared, nearest first, the cause and
    fix (its commands name ``instance``, the one asked about, where it fits the target)."""
    ranked = [word(c, missed, instance) for c in nearest([compare(missed.parts, cand) for cand in candidates])]
    if ranked:
        best = ranked[0]
        cause, fix = best.cause, best.fix
    elif held:
        since = missed.status == ReportedStatus.COMPILED  # a run report: the job compiled it after the miss
        cause = (f"{missed.path} is held in {', '.join(held)}"
                 + (": it was compiled since, and no other entry shares its HLO, graph or model tag" if since
                    else ": no miss there"))
        fix = ("nothing to do: it is cached now" if since
               else "point the job at that store (`neffcache env --store URL`) or copy it where the job looks "
                    "(`neffcache pull`)")
    else:
        where = ", ".join(searched) or "no store"
        cause = f"no entry shares its HLO, graph or model tag ({where}; index: {index or 'not asked'})"
        fix = f"warm it: neffcache warm --instance {instance_for(missed.parts.target, instance)} -- {WORKLOAD}"
    return Explanation(missed, tuple(ranked), cause, fix, tuple(held), tuple(searched), index)
