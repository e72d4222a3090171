"""``neffcache show``: one entry, as a reader deciding whether to load it would want to see it."""

from __future__ import annotations

import time

import click

from neffcache.application.config import load_settings
from neffcache.application.trusted import trust_policy
from neffcache.errors import EntryNotFound
from neffcache.keys import safe_relpath
from neffcache.operations.claims import admission, self_problems, store_reader
from neffcache.scan.report import load_entry
from neffcache.stores import open_store
from neffcache.units import human_bytes

from .options import endpoint_option, store_options
from .output import json_option, render


@click.command("show")
@click.argument("store_url", metavar="STORE")
@click.argument("entry_path", metavar="ENTRY")
@endpoint_option
@json_option
def show_cmd(store_url: str, entry_path: str, as_json: bool) -> None:
    """Show one entry: its state, files and manifest (toolchain, flags, tags, provenance), what
    its signature proves under your trust policy, and where it contradicts its namespace.

    ENTRY is the entry's path in the store, as `neffcache scan --entries` lists it.

    \b
    Example:
      neffcache show /mnt/fsx/cache trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_1234+abb26765
    """
    store = open_store(store_url, read_only=True, create=False, **store_options())
    entry = load_entry(store, safe_relpath(entry_path))
    if entry is None:
        raise EntryNotFound(f"no entry {entry_path} in {store.url}", store=store.url, path=entry_path)
    verdict = admission(trust_policy(load_settings()), store.url, entry)
    mismatches = self_problems(entry, store_reader(store, entry))
    data = {
        "path": entry.path, "layout": entry.layout, "state": entry.state.value, "size": entry.size,
        "problems": list(entry.problems),
        "files": {n: {"size": f.size, "mtime": f.mtime} for n, f in sorted(entry.files.items())},
        "manifest": entry.manifest.to_json() if entry.manifest else None,
        "trust": verdict.to_json(),
        "mismatch": mismatches,
    }

    def text() -> str:
        out = [f"{entry.path}: {entry.state.value}, {human_bytes(entry.size)} ({entry.layout})"]
        out += [f"  problem: {p}" for p in entry.problems]
        out += [f"  {n}  {human_bytes(f.size)}" for n, f in sorted(entry.files.items())]
        m = entry.manifest
        if m is None:
            out.append("  no manifest (written by a runtime; `neffcache pull` or `push` computes one)")
        else:
            tc = m.toolchain.label if m.toolchain else "unknown toolchain"
            out.append(f"  {tc}; flags {' '.join(m.flags) or '(none)'}")
            out.append(f"  produced by {m.producer} at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(m.created))}"
                       f" UTC; compile {m.compile_seconds if m.compile_seconds is not None else '?'} s")
            if m.tags:
                out.append("  tags " + ", ".join(f"{k}={v}" for k, v in sorted(m.tags.items())))
            out.append(f"  provenance: {m.provenance.describe()}" if m.provenance else
                       "  provenance: none recorded (published before neffcache recorded it)")
        out.append(f"  trust: {verdict.verdict.value} ({verdict.detail})")
        out += [f"  MISMATCH {p}" for p in mismatches]
        return "\n".join(out)

    render(as_json, data, text)


COMMANDS: list[click.Command] = [show_cmd]
