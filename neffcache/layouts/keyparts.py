"""What a runtime's key is made of: the questions ``why-miss`` asks a layout about its keys.

A miss is a key that drifted: another compiler, target, LNC or flag, or a runtime that changed
how it turns the flags into its key (neuronxcc's flags-file forms). neffcache cannot invert a
runtime's key, but a layout that knows the rule can *recompute* it: "would the graph of this
entry, built with those flags, get that key under this toolchain?" is how a missed key is
matched against the entries a store holds (neffcache/misses/explain.py). The defaults answer
"unknown", which is right for a runtime whose key only it computes (torchneuron's native keys,
vLLM-Neuron's hashes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neffcache.entry import Namespace


@dataclass(frozen=True)
class KeyRule:
    """How a runtime turns a graph's flags into (part of) its key in one namespace.

    ``form``: the rule's name (neuronxcc: the flags file's form, ``text``, ``list``, ``target``);
    ``hashed``: what is hashed, in a few words; ``target_in_key``: the compile target is part of
    it; ``since``: the first compiler version the version table gives the rule, None for the
    oldest (informative: the form follows the runtime's release, not the compiler)."""

    form: str
    hashed: str
    target_in_key: bool
    since: str | None = None


class KeyQuestions:
    """The defaults of :class:`~neffcache.layouts.base.Layout` for the questions about keys."""

    def claims_key(self, key: str) -> bool:
        """True when ``key`` (an entry's name inside a namespace) has this layout's form."""
        return False

    def graph_of(self, key: str) -> str | None:
        """The part of ``key`` that names the graph whatever its flags and compiler (neuronxcc:
        the graph hash of ``MODULE_<graph>+<flags>``), or None when the key has no such part."""
        return None

    def key_flags(self, flags: Sequence[str]) -> list[str]:
        """``flags`` as they reach the runtime's key (neuronxcc drops the wrapper's own options)."""
        return list(flags)

    def key_with_flags(self, key: str, namespace: Namespace, flags: Sequence[str]) -> str | None:
        """The key the runtime of ``namespace`` gives the graph of entry ``key`` compiled with the
        user ``flags``; None when the layout cannot compute it. Raises
        :class:`~neffcache.errors.FlagsFileError` when ``namespace`` lacks a part the rule needs."""
        return None

    def flags_forms(self) -> tuple[str, ...]:
        """The names of every rule (neuronxcc: flags form) by which this runtime may turn flags
        into keys, so a missed key can be tried under each; () when there is one or none."""
        return ()

    def key_rule(self, namespace: Namespace) -> KeyRule | None:
        """The rule by which the runtime of ``namespace`` keys flags (neuronxcc: the namespace's
        decided flags form, else its version table's), None when unknown."""
        return None

    def key_rule_of_file(self, key: str, name: str, data: bytes) -> KeyRule | None:
        """The rule entry ``key`` was named by, read off its flags file ``name`` (``data``) when
        the file backs the key (neuronxcc: it hashes to the suffix); None when it does not or
        the layout has no such rule."""
        return None

    def flags_target(self, name: str, data: bytes) -> str | None:
        """The compile target a flags file named ``name`` records (neuronxcc's target form), or None."""
        return None

    def job_settings(self, flags: Sequence[str]) -> dict[str, str]:
        """The job settings (environment variables) that give a graph these compiler ``flags``
        under this runtime, so a miss on other flags names what to set (why-miss); {} when the
        layout cannot say."""
        return {}

    def flags_beside(self, file_name: str) -> tuple[str, ...]:
        """The names of the flags files the runtime keeps beside an HLO file named ``file_name``
        (its own name in an entry or a compile work directory), most recent form first; () when
        ``file_name`` is not an HLO of this layout."""
        return ()
