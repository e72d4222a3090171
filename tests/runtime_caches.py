"""Caches laid out the way the runtimes write them, byte for byte, without neffcache: neuronxcc
(libneuronxla), B (TorchNeuron native), C (vLLM-Neuron) and NxD Inference's compiled models.
The one writer of runtime entries for the tests."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

VERSION = "2.21.33363.0+82129205"


def release_form(version: str) -> str:
    """The flags-file form the libneuronxla releases observed with compiler ``version`` write
    (docs/runtimes.md, "neuronxcc"): text <= 2.13, list from 2.14 (2.14.227.0 also text) up to
    2.16.344, target from 2.16.345.0. The form follows the release, not the compiler: tests
    that need the other one name it (``form=``)."""
    numbers = tuple(int(part) for part in version.split("+", maxsplit=1)[0].split("."))
    if numbers < (2, 14):
        return "text"
    return "list" if numbers < (2, 16, 345) else "target"


def flags_file(flags: str, version: str = VERSION, target: str = "trn2", form: str | None = None
               ) -> tuple[str, bytes]:
    """The flags file libneuronxla writes in ``form`` (default: the one released with ``version``):
    text = the flag string in compile_flags.txt; list = a JSON list; target = the list led by --target."""
    form = form or release_form(version)
    if form == "text":
        return "compile_flags.txt", flags.encode()
    if form == "list":
        return "compile_flags.json", json.dumps(flags.split()).encode()
    return "compile_flags.json", json.dumps([f"--target={target}", *flags.split()]).encode()


def module_name(hlo: bytes, flags: str = "", version: str = VERSION, target: str = "trn2",
                form: str | None = None) -> str:
    """``MODULE_<graph>+<md5 of the flags file>[:8]`` as that runtime names the entry."""
    graph = int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big")
    return f"MODULE_{graph}+{hashlib.md5(flags_file(flags, version, target, form)[1]).hexdigest()[:8]}"


def write_neuronxcc_entry(
    root: Path,
    hlo: bytes,
    *,
    version: str = VERSION,
    state: str = "SUCCESS",
    flags: str = "--model-type=transformer",
    legacy: bool = False,
    neff: bytes | None = None,
    target: str = "trn2",
) -> Path:
    """One neuronxcc entry as libneuronxla of ``version`` leaves it (its flags file's form and the
    name's suffix follow the version's release); ``legacy``: the text form (flags.txt, no done)."""
    # legacy forces the text form whatever the version says (a few tests name no version).
    form = "text" if legacy else None
    name, data = flags_file(flags, version, target, form)
    entry = root / f"neuronxcc-{version}" / module_name(hlo, flags, version, target, form)
    entry.mkdir(parents=True, exist_ok=True)
    (root / "lock").touch()
    (entry / "model.hlo_module.pb").write_bytes(hlo)
    (entry / name).write_bytes(data)
    if state == "SUCCESS":
        (entry / "model.neff").write_bytes(neff if neff is not None else b"NEFF" + os.urandom(2048))
        if not legacy:
            (entry / "model.done").touch()
    elif state == "FAILED":
        (entry / "model.log").write_text("ERROR: compilation failed: internal error\n")
    elif state == "LOCKED":
        (entry / "model.hlo_module.pb.lock").touch()
    elif state != "EMPTY":
        raise ValueError(state)
    return entry


# -- form-exact neuronxcc (docs/runtimes.md, "neuronxcc") -----------------------------------------
# The flags suffix of MODULE_<graph>+<flags> is md5(bytes of the flags file)[:8]; the file's form
# follows the libneuronxla release (flags_file above); write_runtime_a writes what each form's
# runtime writes, with the default target trn1.
ERA_TXT = "2.13.72.0+7a3b8c9d"  # text: compile_flags.txt (the flag string), no model.done
ERA_JSON = "2.15.128.0+56dc5a86"  # list: compile_flags.json, json.dumps(user flags)
ERA_TARGET = VERSION  # target (2.16.345.0 on): compile_flags.json, json.dumps(["--target=<t>", *user flags])
ERA_BOTH = "2.14.227.0+2d4f85be"  # shipped with text (SDK 2.19.0) and with list (SDK 2.19.1)


def runtime_module_name(hlo: bytes, flags_bytes: bytes) -> str:
    graph = int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big")
    return f"MODULE_{graph}+{hashlib.md5(flags_bytes).hexdigest()[:8]}"


def write_runtime_a(root: Path, hlo: bytes, *, version: str = VERSION, state: str = "SUCCESS",
                    flags: str = "--model-type=transformer", target: str = "trn1", form: str | None = None) -> Path:
    """One neuronxcc entry exactly as libneuronxla of ``form`` (default: ``version``'s release) leaves it."""
    form = form or release_form(version)
    name, data = flags_file(flags, version, target, form)
    entry = root / f"neuronxcc-{version}" / runtime_module_name(hlo, data)
    entry.mkdir(parents=True, exist_ok=True)
    (root / "lock").touch()
    (entry / "model.hlo_module.pb").write_bytes(hlo)
    (entry / name).write_bytes(data)
    if state == "SUCCESS":
        (entry / "model.neff").write_bytes(b"NEFF" + os.urandom(2048))
        if form != "text":
            (entry / "model.done").touch()
    elif state == "FAILED":
        (entry / "model.log").write_text("Failed compilation with ['neuronx-cc', 'compile']: internal error\n")
    elif state == "LOCKED":
        (entry / "model.hlo_module.pb.lock").touch()
    elif state != "EMPTY":
        raise ValueError(state)
    return entry


# -- other tools' files inside a neuronxcc namespace (docs/runtimes.md, "Files of other tools") ----
def write_optimum_registry(root: Path, version: str = VERSION) -> list[Path]:
    """optimum-neuron's registry: neuronxcc-<v>/0_REGISTRY/<ver>/<arch>/<org>/<model>/<hash>.json."""
    out = []
    for arch, org, model in (("llama", "meta-llama", "Llama-3.1-8B"), ("mistral", "mistralai", "Mistral-7B-v0.3")):
        path = root / f"neuronxcc-{version}" / "0_REGISTRY" / "0.3.0" / arch / org / model / (
            hashlib.sha256(model.encode()).hexdigest()[:20] + ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"model_id": f"{org}/{model}", "batch_size": 4, "sequence_length": 4096}))
        out.append(path)
    return out


def write_optimum_traced_model(root: Path, version: str = VERSION, *, top_level_file: bool = False) -> list[Path]:
    """optimum-neuron's traced models nested in a MODULE directory: MODULE_<h>/<submodel>/model.neuron
    (``top_level_file``: with a config beside the submodels, so the directory looks like an entry)."""
    module = root / f"neuronxcc-{version}" / f"MODULE_{hashlib.sha256(version.encode()).hexdigest()[:20]}"
    if top_level_file:
        module = module.with_name(module.name + "1")
    out = []
    for sub in ("text_encoder", "unet", "vae_decoder"):
        path = module / sub / "model.neuron"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"TRACED" + os.urandom(512))
        out.append(path)
    if top_level_file:
        (module / "config.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
        out.append(module / "config.json")
    return out


def write_nxd_wrapped_neff(entry: Path) -> Path:
    """NxD's wrapped_neff.hlo beside a runtime entry's files."""
    path = entry / "wrapped_neff.hlo"
    path.write_bytes(b"WRAPPED" + os.urandom(256))
    return path


# -- torchneuron: TorchNeuron's native cache (docs/runtimes.md, "torchneuron") ------------------------
# Independent of neffcache.layouts on purpose: the layouts are checked against these, not
# against themselves.
def native_key(op_key: str | bytes) -> str:
    """A 32-hex (128-bit) key standing in for the runtime's XXH3 of op key + config + IR."""
    seed = op_key.encode() if isinstance(op_key, str) else op_key
    return hashlib.md5(seed, usedforsecurity=False).hexdigest()


def write_native_neff(neff_dir: Path, op_key: str | bytes, data: bytes | None = None) -> Path:
    """``<dir>/ab/cd/<32 hex>.neff``, as TorchNeuron's C++ writer stores it (``mkstemp`` of
    ``<shard>/.tmp.XXXXXX``, then rename)."""
    key = native_key(op_key)
    path = neff_dir / key[:2] / key[2:4] / f"{key}.neff"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp.{os.urandom(3).hex()}")
    tmp.write_bytes(data if data is not None else b"NEFF" + os.urandom(512))
    os.replace(tmp, path)
    return path


def write_native_temp(neff_dir: Path, op_key: str) -> Path:
    """The C++ writer's write in flight (or a dead writer's leftover): ``<shard>/.tmp.XXXXXX``."""
    key = native_key(op_key)
    path = neff_dir / key[:2] / key[2:4] / ".tmp.a1B2c3"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"NEFF-partial")
    return path


def kernel_key(seed: str | bytes) -> str:
    """A 64-hex sha256 standing in for the kernel path's key (HLO digest + config, version included)."""
    return hashlib.sha256(seed.encode() if isinstance(seed, str) else seed).hexdigest()


def write_kernel_neff(neff_dir: Path, seed: str | bytes, data: bytes | None = None) -> Path:
    """``<dir>/<K>/<K>.neff``, as TorchNeuron's Python kernel path stores it
    (``NamedTemporaryFile(dir=<dir>/<K>, suffix=".tmp")``, then rename)."""
    key = kernel_key(seed)
    path = neff_dir / key / f"{key}.neff"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"tmp{os.urandom(4).hex()}.tmp")
    tmp.write_bytes(data if data is not None else b"NEFF" + os.urandom(512))
    os.replace(tmp, path)
    return path


def write_kernel_temp(neff_dir: Path, seed: str) -> Path:
    """The kernel path's write in flight: ``<K>/tmpXXXXXXXX.tmp``."""
    key = kernel_key(seed)
    path = neff_dir / key / "tmpa1b2c3d4.tmp"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"NEFF-partial")
    return path


# -- vllm: vLLM-Neuron's compile cache (docs/runtimes.md, "vllm") -----------------------
def vllm_hash(name: str) -> str:
    """A vLLM cache key: 32 hex digits (the runtime's MD5; here of a name)."""
    return hashlib.md5(name.encode()).hexdigest()


def write_vllm_entry(cache_root: Path, name: str, *, complete: bool = True, flat: bool = False) -> Path:
    """``$VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/`` (the local tier; ``flat``: the shared
    tier's ``$NEURON_LIBTORCH_REMOTE_CACHE/<hash>/``, as save_cache() leaves it) with artifacts
    (nested too) and the ``.compilation_complete`` marker, written last."""
    digest = vllm_hash(name)
    entry = cache_root / digest if flat else cache_root / "neuron" / "compile_cache" / digest
    (entry / "context_encoding_model" / "_tp0_bk0").mkdir(parents=True, exist_ok=True)
    (entry / "token_generation_model" / "_tp0_bk0").mkdir(parents=True, exist_ok=True)
    (entry / "model.pt").write_bytes(b"TORCHSCRIPT" + os.urandom(256))
    (entry / "neuron_config.json").write_text(json.dumps({"tp_degree": 1, "batch_size": 1, "name": name}))
    (entry / "context_encoding_model" / "_tp0_bk0" / "model.neff").write_bytes(b"NEFF" + os.urandom(300))
    (entry / "context_encoding_model" / "_tp0_bk0" / "model.hlo_module.pb").write_bytes(os.urandom(200))
    (entry / "token_generation_model" / "_tp0_bk0" / "model.neff").write_bytes(b"NEFF" + os.urandom(300))
    if complete:
        (entry / ".compilation_complete").touch()
    return entry


def write_nxdi_entry(directory: Path, name: str, *, tp: int = 2, settled: bool = True, config: bytes | None = None
                     ) -> Path:
    """What NxDI ``compile()`` leaves in ``directory`` (NEURON_COMPILED_ARTIFACTS, or
    :func:`nxdi_dir` for its default below a model): neuron_config.json, model.pt, the sharded
    weights; no marker. ``settled``: its files dated an hour back (a compile long finished)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "neuron_config.json").write_bytes(config if config is not None else nxdi_config(name))
    (directory / "model.pt").write_bytes(b"TORCHSCRIPT" + os.urandom(512))
    (directory / "weights").mkdir(exist_ok=True)
    for rank in range(tp):
        (directory / "weights" / f"tp{rank}_sharded_checkpoint.safetensors").write_bytes(os.urandom(300))
    if settled:
        old = os.path.getmtime(directory) - 3600
        for p in [directory, *directory.rglob("*")]:
            os.utime(p, (old, old))
    return directory


def nxdi_config(name: str) -> bytes:
    return json.dumps({"model": name, "tp_degree": 2, "batch_size": 1}, sort_keys=True).encode()


def nxdi_dir(root: Path, name: str) -> Path:
    """``<root>/neuron-compiled-artifacts/<md5 of the config JSON>``: NxDI's default below a model."""
    return root / "neuron-compiled-artifacts" / hashlib.md5(nxdi_config(name), usedforsecurity=False).hexdigest()


def all_files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` with its bytes: to prove a command changed nothing."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
