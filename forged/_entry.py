"""The ``forged`` command: ``connect`` and ``status`` try the thin path first
(`forged._thin`: the standard library only), everything else goes to `forged._cli`."""

from __future__ import annotations

import sys

from . import _thin


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    thin = {"connect": _thin.connect, "status": _thin.status}.get(argv[0] if argv else "")
    if thin is not None:
        done = thin(argv[1:])
        if done is not None:
            return done
    from ._cli import main as full

    return full(argv)
