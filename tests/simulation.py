"""A simulated Neuron toolchain installed under one test's tmp_path, for every suite."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.testing.shim import install_compiler_shim, read_invocation_log, simulated_env

# Variables a developer's shell might carry into the tests and change what the simulation does.
_SCRUB_PREFIXES = ("NEURON_", "TORCH_NEURONX_", "NEFFSIM_", "VLLM_")


@dataclass
class Sim:
    """A simulated toolchain installed under one test's tmp_path."""

    root: Path
    bin_dir: Path
    invocation_log: Path
    env: dict[str, str] = field(default_factory=dict)

    def run_workload(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "neffcache.testing.workload", *args],
            env={**self.env, **env}, capture_output=True, text=True, timeout=30, check=False,
        )

    def run_vllm_server(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        """The simulated vLLM-Neuron server; pass ``--exit-when-ready`` or it serves until stopped."""
        return subprocess.run(
            [sys.executable, "-m", "neffcache.testing.vllm_server", *args],
            env={**self.env, **env}, capture_output=True, text=True, timeout=timeout, check=False,
        )

    def run_nxdi(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        """The simulated NxD Inference compile-and-load (``neffcache.testing.nxdi_compile``)."""
        return subprocess.run(
            [sys.executable, "-m", "neffcache.testing.nxdi_compile", *args],
            env={**self.env, **env}, capture_output=True, text=True, timeout=timeout, check=False,
        )

    def compile(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "neuronx-cc"), *args],
            env={**self.env, **env}, capture_output=True, text=True, timeout=30, check=False,
        )

    def compiles(self) -> list[dict[str, object]]:
        return read_invocation_log(self.invocation_log)


def make_sim(tmp_path: Path) -> Sim:
    bin_dir = tmp_path / "bin"
    log = tmp_path / "invocations.jsonl"
    install_compiler_shim(bin_dir, invocation_log=log)
    base = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES)}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "home").mkdir(exist_ok=True)  # the suite-wide conftest may have made it
    env = simulated_env(
        bin_dir,
        base,
        # Nothing may land in ~ or /var/tmp: every default location is pointed into tmp_path.
        HOME=str(tmp_path / "home"),
        TMPDIR=str(tmp_path / "tmp"),
        NEURON_COMPILE_CACHE_URL=str(tmp_path / "xla-cache"),
        NEURON_RT_FAKE_INSTANCE_TYPE="trn2.48xlarge",
        TORCH_NEURONX_COMPILE_ONLY="1",
    )
    return Sim(tmp_path, bin_dir, log, env)
