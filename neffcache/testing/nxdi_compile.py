"""A SIMULATED NxD Inference ``compile()`` then ``load()``: a compiled-model directory, as NxDI writes it.

``python -m neffcache.testing.nxdi_compile --model DIR [--tp-degree N] [--batch-size N]
[--seq-len N[,N...]] [--graphs N] [--hlo-bytes N] [--weights-bytes N]``

Like a vLLM-Neuron 0.x or ``inference_demo`` start on NxDI it builds the model's Neuron
configuration, names its directory, tries to load it, and compiles only when that fails::

    $NEURON_COMPILED_ARTIFACTS/            when set, else
    <model>/neuron-compiled-artifacts/<md5 of neuron_config.json>/
        neuron_config.json                 written first
        model.pt                           the traced model: every graph's NEFF inside
        weights/tp<r>_sharded_checkpoint.safetensors   one per rank, written last

Before compiling it deletes the directory (what older vLLM-Neuron does) and compiles each
graph (context encoding and token generation per sequence bucket, ``--graphs`` each) with the
``neuronx-cc`` found on PATH, as a child process, in a work directory under
``BASE_COMPILE_WORK_DIR`` (default ``$TMPDIR/nxd_model/``, NxDI's ``/tmp/nxd_model/``). There is
no commit marker: NxDI has none. The target comes from ``NEURON_PLATFORM_TARGET_OVERRIDE`` or
``NEURON_RT_FAKE_INSTANCE_TYPE``; ``NEURON_LOGICAL_NC_CONFIG`` overrides the LNC. Simulation knob:
``NEFFSIM_NXDI_MUST_LOAD=1`` fails (exit 1) instead of compiling, a serving pod that must start warm.

Exit status: 0 loaded or compiled, 1 a graph failed (or must load and could not), 2 bad
configuration. The last stderr line counts: ``... hash=<md5> loaded=1 compiled=0 dir=<path>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from neffcache.errors import NeffcacheError
from neffcache.testing._runtime import CompilerRunner, WorkloadLog
from neffcache.testing.env import WorkloadError, is_true, resolve_instance
from neffcache.testing.hlo import DEFAULT_HLO_BYTES, filler, make_hlo
from neffcache.toolchain import compiler_version

PROG = "neffcache.testing.nxdi_compile"
MODEL, CONFIG, ARTIFACTS = "model.pt", "neuron_config.json", "neuron-compiled-artifacts"
MODEL_MAGIC = b"PTSIM1\n"  # not TorchScript: a header, then the NEFFs one after another


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description="SIMULATED NxD Inference compile and "
                                     "load (neffcache.testing): fake NEFFs in a real compiled-model directory.")
    parser.add_argument("--model", required=True, type=Path, help="the model directory (its name names the model)")
    parser.add_argument("--tp-degree", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", default="128", help="sequence buckets, comma-separated")
    parser.add_argument("--graphs", type=int, default=1, help="graphs per bucket and submodel")
    parser.add_argument("--hlo-bytes", type=int, default=DEFAULT_HLO_BYTES)
    parser.add_argument("--weights-bytes", type=int, default=4096, help="bytes of each rank's sharded weights")
    ns = parser.parse_args(argv)
    try:
        ns.buckets = [int(b) for b in ns.seq_len.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--seq-len takes integers, got {ns.seq_len!r}")
    if ns.tp_degree < 1 or ns.batch_size < 1 or ns.graphs < 1 or not ns.buckets:
        parser.error("--tp-degree, --batch-size, --graphs and --seq-len must be positive")
    return ns


def _target(env: Mapping[str, str]) -> tuple[str, int]:
    override = env.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip()
    if override:
        raw = env.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
        return override, int(raw) if raw in ("1", "2") else (2 if override in ("trn2", "trn3") else 1)
    _, target, lnc = resolve_instance(env)
    return target, lnc


def neuron_config(ns: argparse.Namespace, target: str, lnc: int, version: str) -> bytes:
    """The configuration's JSON, as the directory's hash is taken of it."""
    config = {"model": ns.model.name, "tp_degree": ns.tp_degree, "batch_size": ns.batch_size,
              "buckets": ns.buckets, "target": target, "logical_nc_config": lnc, "neuronxcc": version,
              "simulated": True}
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()


def _compile_graphs(ns: argparse.Namespace, target: str, lnc: int, work: Path, runner: CompilerRunner,
                    log: WorkloadLog) -> list[bytes] | None:
    neffs = []
    for sub in ("context_encoding", "token_generation"):
        for bucket in ns.buckets:
            for i in range(ns.graphs):
                hlo = make_hlo(f"{ns.model.name}-{sub}", bucket, i, ns.hlo_bytes)
                src, out = work / f"{sub}_{bucket}_{i}.hlo_module.pb", work / f"{sub}_{bucket}_{i}.neff"
                src.write_bytes(hlo)
                status, output = runner.run(["neuronx-cc", "compile", str(src), "--framework", "XLA", "--target",
                                             target, "--lnc", str(lnc), "--output", str(out)])
                if status != 0 or not out.is_file():
                    log.line(f"RuntimeError: neuronx-cc failed on {sub} bucket {bucket}: {output.strip()[:300]}")
                    return None
                neffs.append(out.read_bytes())
    return neffs


def compile_into(ns: argparse.Namespace, out: Path, config: bytes, target: str, lnc: int, log: WorkloadLog,
                 runner: CompilerRunner) -> bool:
    """NxDI's compile(): the directory removed and written again, the configuration first."""
    shutil.rmtree(out, ignore_errors=True)  # what vLLM-Neuron 0.x does before it compiles
    out.mkdir(parents=True)
    (out / CONFIG).write_bytes(config)
    base = Path(os.environ.get("BASE_COMPILE_WORK_DIR", "").strip() or Path(tempfile.gettempdir()) / "nxd_model")
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="nxdi-") as tmp:
        neffs = _compile_graphs(ns, target, lnc, Path(tmp), runner, log)
    if neffs is None:
        return False
    header = json.dumps({"model": ns.model.name, "graphs": len(neffs), "simulated": True}).encode()
    (out / MODEL).write_bytes(MODEL_MAGIC + header + b"\n" + b"".join(neffs))
    (out / "weights").mkdir()
    for rank in range(ns.tp_degree):
        seed = f"{ns.model.name}/tp{rank}".encode()
        (out / "weights" / f"tp{rank}_sharded_checkpoint.safetensors").write_bytes(filler(seed, ns.weights_bytes))
    return True


def run(ns: argparse.Namespace, log: WorkloadLog, runner: CompilerRunner) -> int:
    target, lnc = _target(os.environ)
    try:
        version = compiler_version()
    except NeffcacheError as exc:
        raise WorkloadError(str(exc)) from None
    config = neuron_config(ns, target, lnc, version)
    digest = hashlib.md5(config, usedforsecurity=False).hexdigest()
    explicit = os.environ.get("NEURON_COMPILED_ARTIFACTS", "").strip()
    out = Path(explicit).absolute() if explicit else ns.model.absolute() / ARTIFACTS / digest
    loaded = (out / MODEL).is_file() and (out / CONFIG).is_file() and (out / CONFIG).read_bytes() == config
    compiled = False
    if not loaded:
        if is_true(os.environ.get("NEFFSIM_NXDI_MUST_LOAD")):
            log.line(f"RuntimeError: no compiled model for this configuration at {out} (NEFFSIM_NXDI_MUST_LOAD=1)")
            return 1
        if not compile_into(ns, out, config, target, lnc, log, runner):
            return 1
        compiled = True
    log.line(f"{PROG}: (simulated) hash={digest} loaded={int(loaded)} compiled={int(compiled)} dir={out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    log = WorkloadLog()
    log.line(f"neffcache.testing: SIMULATED NxD Inference compile (no Neuron runtime; fake NEFFs) pid={os.getpid()}")
    try:
        return run(ns, log, CompilerRunner())
    except (WorkloadError, NeffcacheError, ValueError, OSError) as exc:
        log.line(f"{PROG}: error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
