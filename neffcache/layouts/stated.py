"""What an entry's own compiler flags state about the toolchain it was compiled for.

A NEFF compiled for trn1 and loaded on trn2 is a false hit the runtime does not catch
(aws-neuron-sdk#1259, #1395). Neuron entries carry their inputs, so an entry can be checked
against the namespace it lies in: the compiler's ``--target`` and ``--lnc`` options
(``neuronx-cc compile ... --target {inf2,trn1,trn1n,trn2,trn3} [--lnc {1,2}]``;
docs/runtimes.md) in its flags file say what it was built for; the namespace's target
directory says what its readers run on. A flag the file does not hold proves nothing (most
entries name no ``--lnc``): only a stated value that differs is a problem.
"""

from __future__ import annotations

from collections.abc import Sequence

from neffcache.entry import Namespace

TARGET_OPTION = "--target"
LNC_OPTION = "--lnc"


def stated_option(flags: Sequence[str], option: str) -> str | None:
    """The last value given to ``option`` (``--opt=v`` or ``--opt v``), as the compiler's
    argument parser takes it; None when the flags do not give it."""
    value = None
    for i, flag in enumerate(flags):
        if flag.startswith(option + "="):
            value = flag[len(option) + 1:]
        elif flag == option and i + 1 < len(flags):
            value = flags[i + 1]
    return value


def toolchain_problems(namespace: Namespace, flags: Sequence[str]) -> list[str]:
    """Why ``flags`` (an entry's, with the target its flags file records) contradict the target
    and LNC of ``namespace``; [] when they do not, or when either side does not say."""
    problems = []
    target = stated_option(flags, TARGET_OPTION)
    if target is not None and namespace.target is not None and target != namespace.target:
        problems.append(f"compiled with {TARGET_OPTION}={target}, but it lies in a {namespace.target} namespace "
                        f"({namespace.path}): a {namespace.target} host would load a {target} NEFF")
    lnc = stated_option(flags, LNC_OPTION)
    if lnc is not None and namespace.lnc is not None and lnc != str(namespace.lnc):
        problems.append(f"compiled with {LNC_OPTION}={lnc}, but it lies in an LNC {namespace.lnc} namespace "
                        f"({namespace.path})")
    return problems
