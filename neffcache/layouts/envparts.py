"""What a runtime is run with: the settings that point it at a cache, defeat it, or make it a warm-up.

The defaults of :class:`~neffcache.layouts.base.Layout` for these questions (as
:mod:`neffcache.layouts.keyparts` holds those about keys): ``env`` and ``doctor`` print what a
layout says here, ``warm``, ``plan`` and ``run`` set what it asks for. Each layout answers for its
own runtime from a module of its facts (``neuronxcc_env``, ``torchneuron_env``, ``vllm_env``).
"""

from __future__ import annotations

from collections.abc import Mapping

from neffcache.entry import Namespace
from neffcache.layouts.records import EnvProblem
from neffcache.toolchain import Toolchain


class RuntimeEnv:
    """The defaults: a runtime that needs nothing beyond its cache variables (:meth:`job_env`)."""

    name: str

    def env_notes(self, root: str, namespace: Namespace) -> list[str]:
        """What an operator should know when pointing this runtime at ``namespace`` (``env``)."""
        return []

    def compile_only_env(self, environ: Mapping[str, str], *, retry_failed: bool,
                         toolchain: Toolchain | None = None, workers: int | None = None
                         ) -> tuple[dict[str, str | None], list[str]]:
        """What a warm-up changes in a job's ``environ`` so this runtime compiles into the
        namespace it is pointed at (``retry_failed``: and recompiles cached failures; the
        ``toolchain`` it compiles for; ``workers``: compiles at once, None for the runtime's
        default): (variables to set, ``None`` for one to unset; notes for the report)."""
        return {}, []

    def node_local_env(self, local_root: str, namespace: Namespace) -> dict[str, str]:
        """Variables that point this runtime's node-local tier (a cache it keeps beside the
        shared one, on local disk) at ``namespace`` under the node-local directory
        ``local_root``. Empty (the default): the runtime keeps no such tier."""
        return {}

    def filesystem_note(self) -> str:
        """What ``env`` says when the store is not a filesystem and the runtime needs one."""
        return (f"the {self.name} runtime reads a filesystem path only: mount the bucket "
                "(FSx for Lustre linked to S3) or run `neffcache pull` first")

    def is_ready_line(self, line: str) -> bool:
        """True when ``line`` of a long-running workload's output (a server) says it finished
        starting, compiles included: a warm-up may stop it there. False by default."""
        return False

    def private_env(self, scratch: str) -> dict[str, str]:
        """Variables that move this runtime's host-local state (locks, work directories: not the
        cache itself) under ``scratch``, for a run that must not touch what real jobs on the host
        share (``plan``'s discovery). Default: the runtime keeps none."""
        return {}

    def env_problems(self, environ: Mapping[str, str]) -> list[EnvProblem]:
        """Settings in ``environ`` that would make this runtime ignore the cache neffcache manages
        (neuronxcc: ``--cache_dir`` in ``NEURON_CC_FLAGS``)."""
        return []
