"""The ``forged`` command: ``connect`` and ``status`` try the thin path first, ``stop`` takes
it (`forged._thin`: the standard library only), everything else goes to `forged._cli`, which
never loads the thin path's modules."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--login" in argv and _acp(argv):  # an ACP editor's terminal sign-in method
        from ._login import choose

        return choose()
    if argv[:1] in (["connect"], ["status"]):
        from . import _thin

        done = (_thin.connect if argv[0] == "connect" else _thin.status)(argv[1:])
        if done is not None:
            return done
    if argv[:1] == ["stop"] and not {"-h", "--help"} & set(argv[1:]):
        from . import _thin

        return _thin.stop(argv[1:])
    from ._startup import collector_paused

    with collector_paused():
        from . import _codecache

        _codecache.install()
        from ._cli import main as full
    return full(argv)


def _acp(argv: list[str]) -> bool:
    """`argv` is an ACP front's command line (``--mode acp``, ``connect --acp``)."""
    return ("--acp" in argv and argv[:1] == ["connect"]) or "--mode=acp" in argv or any(
        argv[i:i + 2] == ["--mode", "acp"] for i in range(len(argv)))
