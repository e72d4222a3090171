"""libneuronxla's cache settings in ``NEURON_CC_FLAGS`` (the ``neuronxcc`` layout): what sends
a job's NEFFs elsewhere or turns the cache off, and what a warm-up changes.

The wrapper parses ``--cache_dir``, ``--no_cache``, ``--retry_failed_compilation`` and
``--log_level`` itself and never passes them to the compiler (docs/runtimes.md, "neuronxcc";
the Neuron Persistent Cache page). ``--cache_dir`` wins over ``NEURON_COMPILE_CACHE_URL``;
``--no_cache`` turns the cache off without a word.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from neffcache.layouts import flags as flagsfile
from neffcache.layouts.records import EnvProblem

FLAGS_VAR = "NEURON_CC_FLAGS"
NO_CACHE_FLAG = "--no_cache"  # the persistent cache is off: nothing read, nothing stored


def compile_only(environ: Mapping[str, str], *, retry_failed: bool) -> tuple[dict[str, str | None], list[str]]:
    """``NEURON_CC_FLAGS`` for a warm-up into the namespace it is pointed at: no ``--cache_dir``
    (it would win over the URL), no ``--no_cache`` (nothing would be kept), and the retry flag
    when cached failures are to be compiled again."""
    flags = shlex.split(environ.get(FLAGS_VAR, ""))
    kept = flagsfile.without_cache_dir(flags)
    notes = []
    if len(kept) != len(flags):
        notes.append(f"removed --cache_dir from {FLAGS_VAR}: the warm-up writes to the namespace")
    if NO_CACHE_FLAG in kept:
        kept = [f for f in kept if f != NO_CACHE_FLAG]
        notes.append(f"removed {NO_CACHE_FLAG} from {FLAGS_VAR}: a warm-up without the cache keeps nothing")
    if retry_failed and flagsfile.RETRY_FLAG not in kept:
        kept.append(flagsfile.RETRY_FLAG)
    return {FLAGS_VAR: shlex.join(kept) or None}, notes


def job_settings(flags: Sequence[str]) -> dict[str, str]:
    """The job setting that compiles a graph with these user ``flags``."""
    return {FLAGS_VAR: shlex.join(flags)}


def problems(environ: Mapping[str, str]) -> list[EnvProblem]:
    """A ``--cache_dir`` (the job compiles into a directory neffcache never sees) and a
    ``--no_cache`` (every graph compiles in every job) in the job's ``NEURON_CC_FLAGS``."""
    flags = environ.get(FLAGS_VAR, "").split()
    found = [EnvProblem(FLAGS_VAR, f"{flag} in {FLAGS_VAR} overrides NEURON_COMPILE_CACHE_URL: libneuronxla uses "
                        "that directory, not the one neffcache manages",
                        f"remove --cache_dir from {FLAGS_VAR} and use `neffcache env`")
             for flag in flags if flag.startswith("--cache_dir")]
    if NO_CACHE_FLAG in flags:
        found.append(EnvProblem(FLAGS_VAR, f"{NO_CACHE_FLAG} in {FLAGS_VAR} turns libneuronxla's persistent cache "
                                "off: every graph compiles in every job, nothing is kept",
                                f"remove {NO_CACHE_FLAG} from {FLAGS_VAR}"))
    return found
