"""Runtime facts live in ``neffcache/layouts/`` alone (issue #11, docs/runtimes.md).

Outside the layouts (and ``neffcache.testing``, a simulated runtime that must write the real
files), no code spells a runtime's file or directory names, tests a layout's name or imports
a layout module's internals: it asks the layout. This walks the AST of every module, so
docstrings and comments may explain the runtimes in their words; code may not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from neffcache.instances import TARGETS
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.layouts.base import DEFAULT_LAYOUT
from neffcache.toolchain import LAYOUT_NAMES, Toolchain

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("neffcache", "cli", "server", "warmers")
EXEMPT_DIRS = ("neffcache/layouts/", "neffcache/testing/")

# Names of runtime files and log markers: a string holding one is a runtime fact.
RUNTIME_NAMES = (
    "model.neff", "model.done", "model.log", "hlo_module.pb", "compile_flags", ".compilation_complete",
    "MODULE_", "[NEFF_CACHE]", "NEURON_CC_WRAPPER", "model.pt", "neuron_config.json", "neuron-compiled-artifacts",
    "NEURON_COMPILED_ARTIFACTS",
)
# The one copy of a layout fact outside the layouts, as a value the index server (which ships
# without the layouts) may import: (file, name assigned). neffcache.layouts refuses to import
# if its registry differs, and the tests below hold the copies to the layouts.
DECLARED = {("neffcache/toolchain.py", "LAYOUT_NAMES")}
LAYOUT_MODULES = tuple(f"neffcache.layouts.{m}" for m in ("neuronxcc", "torchneuron", "vllm", "nxdi"))

@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _modules() -> list[Path]:
    out = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(EXEMPT_DIRS):
                out.append(path)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0].value))
    return out


def _declared(tree: ast.AST, rel: str) -> set[int]:
    """ids of the Constant nodes inside an assignment DECLARED allows in this file."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and (rel, t.id) in DECLARED for t in targets):
                out |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant)}
    return out


def _layout_names() -> set[str]:
    return set(LAYOUTS) | {"neuronxcc", "torchneuron"}


def findings_in(path: Path, rel: str | None = None) -> list[Finding]:
    rel = rel or path.relative_to(REPO).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    docs = _docstrings(tree) | _declared(tree, rel)
    layouts = _layout_names()
    out: list[Finding] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value.replace("\\", "")  # regular expressions escape the dots
            hits = [name for name in RUNTIME_NAMES if name in text]
            if hits:
                out.append(Finding(rel, node.lineno, f"runtime name {hits[0]!r} in {node.value[:60]!r}"))
            elif node.value in layouts:
                out.append(Finding(rel, node.lineno, f"layout name {node.value!r} spelled out"))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                elements = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
                if any(isinstance(e, ast.Constant) and e.value in layouts for e in elements):
                    out.append(Finding(rel, node.lineno, "comparison with a layout name"))
                    break
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(LAYOUT_MODULES):
            out.append(Finding(rel, node.lineno, f"import from {node.module} (ask neffcache.layouts)"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(LAYOUT_MODULES):
                    out.append(Finding(rel, node.lineno, f"import of {alias.name} (ask neffcache.layouts)"))
    # A layout-name comparison also holds a layout-name constant: report the line once.
    seen: set[tuple[int, str]] = set()
    unique = []
    for f in sorted(out, key=lambda f: (f.line, not f.what.startswith("comparison"))):
        key = (f.line, "layout" if "layout name" in f.what else f.what)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def test_no_runtime_facts_outside_the_layouts() -> None:
    found = [f for path in _modules() for f in findings_in(path)]
    assert not found, "runtime facts outside neffcache/layouts/ (ask the layout instead):\n" + "\n".join(
        map(str, found))


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Docstrings may say model.neff."""\n'
        "from neffcache.layouts.neuronxcc import HLO\n"
        "def f(entry):\n"
        '    """Nor here: model.done."""\n'
        '    if entry.layout == "torchneuron":\n'
        '        return "x/model.log"\n'
        '    return f"{entry}/MODULE_{HLO}"\n'
        "PATTERN = r'\\S+\\.hlo_module\\.pb'\n"
        'BOTH = ("neuronxcc", "torchneuron")\n'
    )
    found = findings_in(sample, "neffcache/sample.py")
    assert [(f.line, f.what.split(" ")[0]) for f in found] == [
        (2, "import"), (5, "comparison"), (6, "runtime"), (7, "runtime"), (8, "runtime"), (9, "layout")]


def test_layout_names_are_the_registry() -> None:
    assert tuple(LAYOUTS) == LAYOUT_NAMES


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lnc", [1, 2])
def test_toolchain_namespace_dir_is_the_default_layouts(target: str, lnc: int) -> None:
    toolchain = Toolchain("2.27.5334.0+f702b353", target, lnc)
    assert toolchain.namespace_dir == get_layout(DEFAULT_LAYOUT).namespace_for(toolchain).path


def test_only_a_declared_assignment_may_spell_layout_names(tmp_path: Path) -> None:
    sample = tmp_path / "toolchain.py"
    sample.write_text('LAYOUT_NAMES = ("neuronxcc", "torchneuron")\nOTHER = ("neuronxcc",)\n')
    assert [f.line for f in findings_in(sample, "neffcache/toolchain.py")] == [2]
    assert [f.line for f in findings_in(sample, "neffcache/elsewhere.py")] == [1, 2]
