"""A SIMULATED Neuron toolchain for tests, demos and pipeline rehearsals (not the Neuron SDK).

The real ``neuronx-cc``, torch-neuronx and libneuronxla cannot be installed here, yet
neffcache always runs a real ``neuronx-cc`` from PATH and real workload processes. This
package provides stand-ins with the real interfaces:

- ``python -m neffcache.testing.compiler``: the ``neuronx-cc`` CLI (``--version``,
  ``compile``), writing deterministic fake NEFFs (:mod:`.compiler`, :mod:`.neff`);
- :func:`neffcache.testing.shim.install_compiler_shim`: puts it on a PATH as ``neuronx-cc``;
- ``python -m neffcache.testing.workload``: a compile-only TorchNeuron / torch-xla run that
  reads the real environment contract and writes neuronxcc or torchneuron entries (:mod:`.workload`);
- ``python -m neffcache.testing.vllm_server``: a vLLM-Neuron OpenAI server's start-up, which
  compiles through vLLM's two tiers (local and flat remote) and prints uvicorn's ready lines
  (:mod:`.vllm_server`, :mod:`.vllm_cache`);
- :func:`neffcache.testing.hlo.make_hlo`: deterministic fake HLO modules.

It simulates the *runtime*, independently of neffcache's layouts and stores (it must not
import them, or tests of those would check the code against itself).

Beside the simulation, :mod:`.store_contract` is the store contract suite every backend's
tests run (fsspec's habit of shipping its abstract tests); it imports pytest and the library,
and only tests import it.

This ``__init__`` imports nothing: the compiler stand-in starts hundreds of times in
benchmarks and must stay cheap to import.
"""

from __future__ import annotations
