"""The neuronxcc layout's flags file and the ``+<suffix>`` of a ``MODULE_<graph>+<suffix>`` name, as forms.

libneuronxla names an entry ``MODULE_<graph_hash>+<flags_hash>`` where ``flags_hash`` is
``md5(bytes of the entry's flags file)[:8]`` (recomputed from real MODULE names and the flags
shown beside them, docs/runtimes.md, "neuronxcc"). What the file holds is a *form*: a file name
times an encoding of the user flags::

    form         file                 content (the bytes hashed)               seen with compiler
    text         compile_flags.txt    the flag string                          <= 2.13, some 2.14.227.0
    list         compile_flags.json   json.dumps([*user flags])                2.14.227.0, 2.15.x
    target       compile_flags.json   json.dumps(["--target=<t>", *flags])     2.16.345.0 on
    json-string  compile_flags.json   the flag string                          one 2.15.141.0 caller

The form follows the **libneuronxla release**, not the compiler version (SDK 2.19.0 and 2.19.1
shipped the same compiler 2.14.227.0, one writing text, the other list), so a namespace's form
is decided from its own entries (:mod:`neffcache.layouts.flags_form`); the version table here
(:func:`form_by_version`) answers only for a namespace without evidence, and says when a
version was seen with two forms. A form is read off an entry only when its flags file hashes
to its suffix (:func:`adopted_form`): then the runtime named the entry from those very bytes,
which is the whole argument for trusting it.

``--cache_dir=`` (and ``--retry_failed_compilation``, a wrapper option too) never reach the
file; ``--verbose=35`` is added to the compiler's command line after hashing. A real 2.26 trn2
entry ``+839ddec0`` had NEURON_CC_FLAGS ``--model-type=transformer --optlevel=1
--enable-saturate-infinity --lnc=2``: its file is ``["--target=trn2", "--model-type=transformer",
"--optlevel=1", "--enable-saturate-infinity", "--lnc=2"]``, so ``--lnc=2`` is one of the *user*
flags there; whether the wrapper adds an ``--lnc`` of its own when the user gives none is
unverified, and nothing here adds one. Text-form runtimes write no ``model.done``: the NEFF
commits their entries (:attr:`FlagsForm.neff_commits`).

Pure functions, no I/O: callers read and write the files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from neffcache.errors import FlagsFileError
from neffcache.layouts.keyparts import KeyRule

FLAGS_TXT = "compile_flags.txt"
FLAGS_JSON = "compile_flags.json"
TARGET_FLAG = "--target="
# Options of the wrapper, not of the compiler: never in the flags file.
CACHE_DIR_FLAG = "--cache_dir"
RETRY_FLAG = "--retry_failed_compilation"  # the wrapper recompiles a cached failure
WRAPPER_ONLY = (CACHE_DIR_FLAG, RETRY_FLAG)
SUFFIX_LEN = 8


class Encoding(Enum):
    """How the user flags become the bytes of the flags file (and so of the suffix)."""

    STRING = "string"  # " ".join(flags)
    LIST = "list"  # json.dumps(flags)
    TARGET_LIST = "target-list"  # json.dumps(["--target=<t>", *flags])


@dataclass(frozen=True)
class FlagsForm:
    """One form of the flags file: its name x how the flags are encoded in it."""

    name: str
    file_name: str
    encoding: Encoding

    @property
    def target_in_key(self) -> bool:
        return self.encoding is Encoding.TARGET_LIST

    @property
    def neff_commits(self) -> bool:
        """True when the runtime of this form writes no ``model.done``: its NEFF commits the entry."""
        return self.file_name == FLAGS_TXT

    @property
    def hashed(self) -> str:
        """What the flags file holds, in a few words (``why-miss`` shows it)."""
        what = {Encoding.STRING: "the flag string", Encoding.LIST: "the list of flags",
                Encoding.TARGET_LIST: "--target=<t> then the list of flags"}[self.encoding]
        return f"{self.file_name}: {what}"


TEXT = FlagsForm("text", FLAGS_TXT, Encoding.STRING)
LIST = FlagsForm("list", FLAGS_JSON, Encoding.LIST)
TARGET = FlagsForm("target", FLAGS_JSON, Encoding.TARGET_LIST)
# Seen once (a 2.15.141.0 transformers-neuronx entry, aws-neuron-sdk#1023): the md5 of the flag
# string in a JSON-era namespace. Adopted only from an entry whose file hashes to its suffix.
JSON_STRING = FlagsForm("json-string", FLAGS_JSON, Encoding.STRING)
FORMS = {f.name: f for f in (TEXT, LIST, TARGET, JSON_STRING)}
CHOOSABLE = (TEXT.name, LIST.name, TARGET.name)  # what an operator may force (--flags-form)

# The version table, for a namespace without evidence: full versions compared, +hash ignored.
TARGET_SINCE = (2, 16, 345, 0)  # the first version a target-form sample was seen with
LIST_SINCE = (2, 14)  # text up to 2.13
# SDK 2.19.0 wrote text, 2.19.1 list, with the same compiler.
AMBIGUOUS: dict[tuple[int, ...], tuple[FlagsForm, ...]] = {(2, 14, 227, 0): (TEXT, LIST)}


@dataclass(frozen=True)
class TableAnswer:
    """What the version table says of a compiler version: the form, and the other forms that
    version was seen with (empty unless the version is ambiguous)."""

    form: FlagsForm
    also_seen: tuple[FlagsForm, ...] = ()

    @property
    def ambiguous(self) -> bool:
        return bool(self.also_seen)


def version_key(version: str) -> tuple[int, ...] | None:
    """The numeric parts of ``2.16.345.0+a1b2c3``, padded to four; None when not a version."""
    parts = version.split("+", 1)[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        return None
    numbers = tuple(int(p) for p in parts)
    return numbers + (0,) * (4 - len(numbers))


@functools.lru_cache(maxsize=256)
def form_by_version(version: str) -> TableAnswer | None:
    """The version table's answer for ``version``; None when the version cannot be read."""
    key = version_key(version)
    if key is None:
        return None
    if key < LIST_SINCE:
        return TableAnswer(TEXT)
    if key < TARGET_SINCE:
        seen = AMBIGUOUS.get(key[:4], ())
        return TableAnswer(LIST, tuple(f for f in seen if f is not LIST))
    return TableAnswer(TARGET)


def first_version(form: FlagsForm) -> str | None:
    """The first compiler version the version table gives ``form``; None for the oldest form
    and for a form the table never gives."""
    return {LIST: ".".join(map(str, LIST_SINCE)), TARGET: ".".join(map(str, TARGET_SINCE))}.get(form)


def key_rule(form: FlagsForm) -> KeyRule:
    """``form`` as the rule by which the runtime keys flags (what ``why-miss`` compares)."""
    return KeyRule(form=form.name, hashed=form.hashed, target_in_key=form.target_in_key, since=first_version(form))


def version_table_text() -> str:
    """The table in one line (for help texts and explanations)."""
    return "<= 2.13 text; 2.14 up to 2.16.344 list (2.14.227.0: text and list both seen); >= 2.16.345.0 target"


def forms_help() -> str:
    """What each form an operator may force writes, for a help text."""
    return (f"text: {FLAGS_TXT}, the flag string, no model.done; list: {FLAGS_JSON}, the flags as a JSON "
            "list; target: the list led by --target=<t>")


def user_flags(flags: Sequence[str]) -> list[str]:
    """``flags`` without the wrapper's own options (``--cache_dir[=]DIR``, retry)."""
    out: list[str] = []
    skip_next = False
    for flag in flags:
        if skip_next:
            skip_next = False
            continue
        name = flag.split("=", 1)[0]
        if name in WRAPPER_ONLY:
            skip_next = name == "--cache_dir" and "=" not in flag
            continue
        out.append(flag)
    return out


def without_cache_dir(flags: Sequence[str]) -> list[str]:
    """``flags`` without ``--cache_dir=DIR`` or ``--cache_dir DIR`` (which would send the
    runtime's NEFFs to a directory other than the namespace it is pointed at)."""
    out: list[str] = []
    skip_next = False
    for flag in flags:
        if skip_next:
            skip_next = False
        elif flag == CACHE_DIR_FLAG:
            skip_next = True
        elif not flag.startswith(CACHE_DIR_FLAG + "="):
            out.append(flag)
    return out


def flags_file(form: FlagsForm, target: str | None, flags: Sequence[str]) -> tuple[str, bytes]:
    """(name, bytes) of the flags file a runtime of ``form`` writes for these user flags.

    ``target`` is required by the target form (it is the list's first element), ignored by the others.
    """
    flags = user_flags(flags)
    if form.encoding is Encoding.STRING:
        return form.file_name, " ".join(flags).encode()
    if form.encoding is Encoding.LIST:
        return form.file_name, json.dumps(flags).encode()
    if not target:
        raise FlagsFileError("the target form (neuronx-cc 2.16.345.0 on) puts the target in the flags file: "
                             "it is unknown")
    return form.file_name, json.dumps([TARGET_FLAG + target, *flags]).encode()


def suffix_of(data: bytes) -> str:
    """The ``+<suffix>`` a runtime gives an entry whose flags file holds ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()[:SUFFIX_LEN]


def _flag_string(data: bytes) -> str | None:
    """``data`` as a flag string (empty, or printable text starting with ``-``), else None."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    if text and (not text.startswith("-") or not text.isprintable()):
        return None
    return text


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def form_of_file(name: str, data: bytes) -> FlagsForm | None:
    """The form a flags file named ``name`` holding ``data`` is in, or None when it is in none
    (binary, garbage, a JSON value that is not a list of strings). Says nothing of whether the
    file belongs to its entry: :func:`adopted_form` checks that."""
    if name == FLAGS_TXT:
        try:
            data.decode()
        except UnicodeDecodeError:
            return None
        return TEXT
    if name != FLAGS_JSON:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return JSON_STRING if _flag_string(data) is not None else None
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        return None
    return TARGET if value and value[0].startswith(TARGET_FLAG) else LIST


def adopted_form(key: str, name: str, data: bytes) -> FlagsForm | None:
    """The form of entry ``key``'s flags file when the file hashes to the key's suffix (the
    runtime named the entry from these very bytes), else None: only such a file is evidence."""
    if suffix_problem(key, data) is not None:
        return None
    return form_of_file(name, data)


def string_hashed_list(key: str, name: str, data: bytes) -> bool:
    """True when a JSON list of flags does not hash to ``key``'s suffix but its space-joined
    string does (the caller hashed the string, not the file it wrote: the 2.15.141.0 anomaly).
    Reported, never adopted: the file does not back the name."""
    parts = split_module(key)
    if parts is None or form_of_file(name, data) not in (LIST, TARGET) or suffix_of(data) == parts[1]:
        return False
    return suffix_of(" ".join(json.loads(data)).encode()) == parts[1]


def read_flags_file(name: str, data: bytes) -> tuple[list[str], str | None]:
    """(user flags, target or None) recovered from a flags file named ``name``.

    A JSON list whose first element is ``--target=<t>`` is the target form. Raises
    :class:`FlagsFileError` when the file is in no form (:func:`form_of_file`).
    """
    form = form_of_file(name, data)
    if form is None:
        if name == FLAGS_TXT:
            raise FlagsFileError(f"{name} is not text")
        raise FlagsFileError(f"{name} is neither a JSON list of strings nor a flag string")
    if form.encoding is Encoding.STRING:
        return _split(data.decode()), None
    value = json.loads(data)
    if form is TARGET:
        return value[1:], value[0][len(TARGET_FLAG):] or None
    return value, None


def split_module(key: str) -> tuple[str, str] | None:
    """(graph hash, flags suffix) of ``MODULE_<g>+<f>``, or None for another name."""
    if not key.startswith("MODULE_"):
        return None
    graph, plus, suffix = key[len("MODULE_"):].partition("+")
    if not plus or not graph or not suffix:
        return None
    return graph, suffix


def module_name(graph: str, suffix: str) -> str:
    return f"MODULE_{graph}+{suffix}"


def suffix_problem(key: str, data: bytes) -> str | None:
    """Why the flags file ``data`` does not belong to entry ``key``, or None when it does."""
    parts = split_module(key)
    if parts is None:
        return f"{key} is not a MODULE_<graph>+<flags> name"
    got = suffix_of(data)
    if got != parts[1]:
        return (f"flags file does not match the MODULE name (md5 {got}, name says +{parts[1]}): "
                "would publish a NEFF built with other flags than its key says")
    return None
