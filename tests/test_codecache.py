"""The compiled code of attrs' and cattrs' generated functions, kept between runs
(`forged._codecache`), seen from real processes with a runtime folder of the test's own."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

GET_STATE = b'{"type":"get_state","id":"s"}\n'


def start(cache: Path, *, write: bool = True) -> subprocess.CompletedProcess[bytes]:
    """``forged --mode rpc`` answering one ``get_state``, `cache` its ``XDG_RUNTIME_DIR``."""
    env = {key: value for key, value in os.environ.items()
           if key != "PYTHONDONTWRITEBYTECODE"}
    env["XDG_RUNTIME_DIR"] = str(cache)
    env["AGENT_FORGE_DIR"] = str(cache.parent / "agent")
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, "-m", "forged", "--mode", "rpc"], input=GET_STATE,
                          capture_output=True, env=env, cwd=cache.parent, timeout=60)


def answered(done: subprocess.CompletedProcess[bytes]) -> bool:
    return done.returncode == 0 and json.loads(done.stdout)["success"] is True


def cache_file(cache: Path) -> Path:
    (found,) = (cache / "forged").glob("code-*")
    return found


def poison(path: Path) -> None:
    """Every entry of the cache at `path` made code that exits with status 97."""
    held = marshal.loads(path.read_bytes())
    exit_97 = marshal.dumps(compile("raise SystemExit(97)", "<poison>", "exec"))
    path.write_bytes(marshal.dumps(dict.fromkeys(held, exit_97)))


def test_the_first_start_keeps_its_compiled_code_for_the_next(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert answered(start(cache))
    kept = cache_file(cache)
    assert (cache / "forged").stat().st_mode & 0o777 == 0o700
    assert kept.stat().st_mode & 0o777 == 0o600
    assert len(marshal.loads(kept.read_bytes())) > 50
    before = kept.stat()
    assert answered(start(cache))
    after = kept.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # all hits
    poison(kept)
    assert start(cache).returncode == 97  # what the next start runs is the cache's


@pytest.mark.parametrize("problem", ["folder others may enter", "file others may write"])
def test_a_cache_another_user_could_have_written_is_not_run(
        tmp_path: Path, problem: str) -> None:
    cache = tmp_path / "cache"
    assert answered(start(cache))
    kept = cache_file(cache)
    poison(kept)
    if problem == "folder others may enter":
        os.chmod(cache / "forged", 0o777)
    else:
        os.chmod(kept, 0o666)
    planted = kept.read_bytes()
    assert answered(start(cache))
    if problem == "folder others may enter":
        assert kept.read_bytes() == planted  # nothing written where others may
    else:  # replaced by a file of the user's alone
        assert kept.read_bytes() != planted and kept.stat().st_mode & 0o777 == 0o600


def test_a_cache_that_does_not_read_back_is_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert answered(start(cache))
    kept = cache_file(cache)
    kept.write_bytes(b"not marshal data")
    assert answered(start(cache))
    assert len(marshal.loads(kept.read_bytes())) > 50


def test_nothing_is_written_when_python_is_told_not_to_write_bytecode(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert answered(start(cache, write=False))
    assert not (cache / "forged").exists()


def test_a_hit_runs_what_compiling_would_have_made_even_where_attrs_seeds_a_hash(
        tmp_path: Path) -> None:
    """attrs writes ``hash`` of a name, which changes with the process's hash seed, into a
    frozen class's ``__hash__``: a process with another seed gets it from the cache, every
    source a hit, and the same code as compiling makes (compared once the cache is off: the
    same instructions, constants and names; where the number's width changed, the columns
    a traceback would point at in that line differ)."""
    code = ("import importlib, sys\n"
            "import forged._codecache as cache\n"
            "cache.install()\n"
            "import forged._sandbox as sandbox\n"
            "def of(cls):\n"
            "    return [(f.co_code, f.co_consts, f.co_names, f.co_varnames) for f in\n"
            "            (cls.__hash__.__code__, cls.__init__.__code__)]\n"
            "made = of(sandbox.Policy)\n"
            "missed = cache._missed\n"
            "cache.save()\n"
            "importlib.reload(sandbox)\n"
            "print(missed, made == of(sandbox.Policy))\n")
    env = {key: value for key, value in os.environ.items()
           if key != "PYTHONDONTWRITEBYTECODE"}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    said = [subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                           env={**env, "PYTHONHASHSEED": seed}).stdout.split()
            for seed in ("1", "2")]
    assert int(said[0][0]) > 0 and said[0][1] == b"True"
    assert said[1] == [b"0", b"True"]
