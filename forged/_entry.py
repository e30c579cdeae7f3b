"""The ``forged`` command: ``connect`` and ``status`` try the thin path first, ``stop`` takes
it (`forged._thin`: the standard library only), everything else goes to `forged._cli`, which
never loads the thin path's modules."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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
