"""Who publishes: the provenance a minted manifest gets, and the key that signs it.

Every manifest neffcache writes is one of two kinds, and this module is where the difference is
kept (issue 37):

- **minted** by this process (:attr:`Manifest.minted`): built from a compile it ran or from an
  entry a runtime wrote that it adopts (``build_manifest``, a transfer of an entry without a
  manifest). It gets this process's :class:`~neffcache.provenance.Provenance`, and the
  publisher's key, when there is one, signs it at publish, once every digest is known;
- **carried** from another store (pull, prefetch, tiers, push of a published entry): it keeps
  the provenance and signature it came with. Its signature stays only while it still covers
  the manifest being written (:func:`seal` compares the signed bytes, no key needed); a publish
  that changed the record (tags merged into it) drops a signature it could not keep rather than
  write one a reader would find broken. It is never re-signed here: a host that signs what it
  merely copied would launder whatever it was given; ``promote`` re-signs deliberately, after
  verifying.

What is signed is the entry at its **canonical path**, the path its runtime's writer uses
(:meth:`Layout.plan_entry`): the same entry lies at another path in a node-local tier of its
runtime's own form (vLLM's ``neuron/compile_cache/<hash>``), and must verify there too.

The publisher is process-wide (:func:`use`, :func:`current`): a command sets it once (what it is,
``warm``..., and the settings' key), and every publish in the process, on any thread, reads the
same one. Without one set, manifests are minted as ``put`` (the library API), unsigned.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from neffcache.entry import Entry, Namespace
from neffcache.errors import NeffcacheError
from neffcache.layouts import get_layout
from neffcache.manifest import Manifest
from neffcache.provenance import MAX_FIELD, How, Provenance
from neffcache.signing import SigningKey, signed_bytes
from neffcache.toolchain import Toolchain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publisher:
    """What this process says of the entries it mints: how (the command), as whom (a signing
    key's id, else an index token's name), on which instance, signed with which key."""

    how: How | str = How.PUT
    signing_key: SigningKey | None = None
    identity: str = ""
    instance: str | None = None

    def provenance(self, toolchain: Toolchain | None) -> Provenance:
        who = self.signing_key.id if self.signing_key is not None else self.identity
        return Provenance.here(self.how, identity=who, toolchain=toolchain, instance=self.instance)

    def mint(self, manifest: Manifest) -> Manifest:
        """``manifest`` as this process's own: its provenance (kept if the caller set one) and
        marked minted, so publish signs it."""
        provenance = manifest.provenance or self.provenance(manifest.toolchain)
        return dataclasses.replace(manifest, provenance=provenance, signature=None, minted=True)


def promoted(manifest: Manifest, source: str, publisher: Publisher | None = None) -> Manifest:
    """``manifest``, verified by the caller in the tier ``source``, vouched for again by this
    process (``promote``): the original producer's record stays, noting where it came from and
    which key had signed it; marked minted, so publish signs it with this publisher's key."""
    publisher = publisher or current()
    signer = manifest.signature.key_id if manifest.signature is not None else "unsigned"
    base = manifest.provenance or publisher.provenance(manifest.toolchain)
    who = publisher.signing_key.id if publisher.signing_key is not None else publisher.identity
    provenance = dataclasses.replace(base, how=str(How.PROMOTE), identity=who,
                                     promoted_from=f"{source} (key {signer})"[:MAX_FIELD])
    return dataclasses.replace(manifest, provenance=provenance, signature=None, minted=True)


_process: dict[str, Publisher] = {"publisher": Publisher()}


def use(publisher: Publisher) -> None:
    """Make ``publisher`` this process's (a command does it once, before it publishes)."""
    _process["publisher"] = publisher


def current() -> Publisher:
    return _process["publisher"]


def canonical_path(namespace: Namespace, key: str) -> str:
    """The path a signature binds for entry ``key`` of ``namespace``: its runtime writer's."""
    return get_layout(namespace.layout).plan_entry(namespace, key).path


def entry_canonical_path(entry: Entry) -> str:
    try:
        return canonical_path(entry.namespace, entry.key)
    except (ValueError, NeffcacheError):  # a key the layout cannot plan: bound where it lies
        return entry.path


def seal(manifest: Manifest, carried: Manifest, namespace: Namespace, key: str,
         publisher: Publisher | None = None) -> Manifest:
    """The manifest to write for entry ``key``, as publish completed it from ``carried`` (what the
    caller handed in): a minted one signed with the publisher's key; a carried one with its
    signature if that still covers it, else without (logged)."""
    publisher = publisher or current()
    if manifest.minted:
        if publisher.signing_key is None:
            return dataclasses.replace(manifest, signature=None)
        return publisher.signing_key.sign(manifest, canonical_path(namespace, key))
    signature = carried.signature
    if signature is None:
        return manifest
    path = canonical_path(namespace, key)
    if signed_bytes(dataclasses.replace(manifest, signature=None), path) == signed_bytes(
            dataclasses.replace(carried, signature=None), path):
        return dataclasses.replace(manifest, signature=signature)
    log.warning("%s: the record changed on its way (tags added), so key %s's signature no longer covers "
                "it; written unsigned", path, signature.key_id)
    return dataclasses.replace(manifest, signature=None)
