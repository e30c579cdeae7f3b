"""The code attrs and cattrs generate, compiled once and kept between runs.

attrs writes each class's ``__init__`` as Python source and compiles it, and cattrs does the
same for each converter hook: ~100 compilations of forged's own before a fresh process answers
its first command (~190 with trio's classes, ~30 ms), ~800 by the end of its warm-up. Their
sources are the same from one run to the next, and so is what they compile to. `install`
gives both libraries a ``compile`` (a module global, found before the builtin) that looks the
source up in a cache first: a hit is one `marshal.loads`, ~1/20 of compiling. What runs is
what the builtin would have made: the key is a digest of the whole source with the filename,
mode and flags, and the file is per interpreter build (as ``__pycache__``'s magic number).
attrs writes a number into each class's ``__hash__`` that changes from process to process
(``hash`` of a name): the key has a placeholder in its place, and a hit gets this process's
number put into its constants (the same instructions; only the columns a traceback would point
at in that line may be off by the number's change of width).

Trust: the file holds code forged runs, unconfined, on its next start, so it lives where
neither another user nor a confined command can write: the daemon's folder
(``$XDG_RUNTIME_DIR/forged``, else ``/tmp/forged-<uid>/forged``; the socket's), which the
sandbox leaves read-only and which must be the user's with no access for others. (A cache under
``~/.cache`` would be writable by a command whose workspace is the home folder, or whose
writable roots take ``~/.cache`` in: a way out of the sandbox on the next start.) The file is
read only when it is the user's and no one else may write it; anything else, or a file that
does not read back, is ignored. Being in the runtime folder, it goes with a reboot.

Missed sources are added when `save` is called (after the warm-up, and at exit): the file is
rewritten whole, by a rename, unless Python was told not to write bytecode; a full disk only
costs the next run the compilations.
`save` also drops what the cache held: later compilations (rare) go to the builtin.
"""

from __future__ import annotations
import __future__

import atexit
import builtins
import hashlib
import marshal
import os
import sys
from types import CodeType

from ._runtime import check_runtime, code_cache_path, default_socket_path, runtime_folder

MAX_ENTRIES = 5000
"""A file with more entries than this (sources left by older versions) is rewritten with only
the ones this run used."""
FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag

_held: dict[bytes, bytes] | None = None
"""The file's entries (a key's digest: the code's marshal bytes), read at the first
compilation; None until then and after `save`."""
_used: dict[bytes, bytes] = {}
_missed = 0
_done = False


def path() -> str:
    return code_cache_path()


def _read() -> dict[bytes, bytes]:
    try:
        check_runtime(default_socket_path())
        descriptor = os.open(path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except Exception:  # no folder of the user's alone, or no file
        return {}
    try:
        info = os.fstat(descriptor)
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return {}
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            held = marshal.loads(file.read())
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    finally:
        os.close(descriptor)
    return held if isinstance(held, dict) else {}


class CachedCompile:
    """``compile`` as a module that inherits the future features `inherited` calls it."""

    def __init__(self, inherited: int) -> None:
        self.inherited = inherited

    def __call__(self, source: object, filename: str, mode: str, flags: int = 0,
                 dont_inherit: bool = False, optimize: int = -1) -> object:
        global _missed
        flags |= 0 if dont_inherit else self.inherited
        seed = _seed(source, filename)
        if _done or optimize != -1 or not isinstance(source, str) or seed == 0:
            return builtins.compile(source, filename, mode,  # type: ignore[call-overload]
                                    flags, True, optimize)
        if seed is not None:
            source = source.replace(str(seed), "<hash>")
        key = hashlib.blake2b(
            f"{mode}\0{flags}\0{sys.flags.optimize}\0{filename}\0{source}".encode(
                "utf-8", "surrogatepass"), digest_size=16).digest()
        held, blob = _cached(key)
        if held is not None and seed is not None:
            if not (isinstance(held, tuple) and len(held) == 2 and isinstance(held[0], int)
                    and isinstance(held[1], CodeType)):
                held = None
            else:
                held = _reseeded(held[1], held[0], seed)
        if not isinstance(held, CodeType):
            compiling = source if seed is None else source.replace("<hash>", str(seed))
            held = builtins.compile(compiling, filename, mode, flags, True)
            blob = marshal.dumps(held if seed is None else (seed, held))
            _missed += 1
        _used[key] = blob
        return held


def _seed(source: object, filename: str) -> int | None:
    """The number attrs wrote into a class's ``__hash__`` (``hash`` of a name, which changes
    from process to process); None when `source` has no ``__hash__``, 0 when its number is not
    found (such a source is compiled each time)."""
    if not isinstance(source, str) or "__hash__" not in source:
        return None
    seed = hash(filename.replace("<attrs generated methods ", "<attrs generated hash ", 1))
    return seed if str(seed) in source and seed != 0 else 0


def _reseeded(code: CodeType, old: int, new: int) -> CodeType:
    """`code` with the constant `old` made `new`, in the functions it defines too."""
    def swap(constant: object) -> object:
        if type(constant) is int:
            return new if constant == old else constant
        if isinstance(constant, CodeType):
            return _reseeded(constant, old, new)
        if type(constant) is tuple:
            return tuple(swap(item) for item in constant)
        return constant

    return code.replace(co_consts=tuple(swap(constant) for constant in code.co_consts))


def _cached(key: bytes) -> tuple[object, bytes]:
    """What the cache holds for `key` (code, or a seed and code, or None), and its bytes."""
    global _held
    if _held is None:
        _held = _read()
    blob = _held.get(key, b"N")
    try:
        return marshal.loads(blob), blob
    except (ValueError, EOFError, TypeError):
        return None, b"N"


def install() -> None:
    """Give attrs and cattrs the cached ``compile``; once, before forged's classes are made
    (attrs' first, before cattrs makes its own classes)."""
    import attr._make

    _give(attr._make, attr._make._compile_and_eval.__code__.co_flags)
    import cattrs.gen

    _give(cattrs.gen, cattrs.gen.make_dict_unstructure_fn.__code__.co_flags)
    atexit.register(save)


def _give(module: object, flags: int) -> None:
    if not isinstance(getattr(module, "compile", None), CachedCompile):
        module.compile = CachedCompile(flags & FUTURE_FLAGS)  # type: ignore[attr-defined]


def save() -> None:
    """Write what was compiled anew (if anything), then hold nothing more."""
    global _held, _missed, _done
    held, _held, _done = _held or {}, None, True
    if not _missed or sys.dont_write_bytecode:
        _used.clear()
        return
    kept = {**held, **_used} if len(held) + len(_used) <= MAX_ENTRIES else dict(_used)
    _used.clear()
    _missed = 0
    try:
        runtime_folder(default_socket_path())
        temporary = f"{path()}.{os.getpid()}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
    except Exception:  # no folder of the user's alone to write in: no cache
        return
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(marshal.dumps(kept))
        os.replace(temporary, path())
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
