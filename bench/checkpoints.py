"""What checkpoints cost on a large tree: 10,000 files of 10 KB (100 MB) in nested folders.
Run by hand:

    .venv/bin/python bench/checkpoints.py [--files 10000] [--repeat 5]

Times, through the shadow repository forged uses (`forged._checkpoints.Shadow`): the first
capture of the tree, an incremental capture after 3 files changed (target <= 50 ms on two
cores), and a restore of 100 changed files (the capture it starts with included). Reports
min, median and max over the repeats, each on a fresh tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from forged._checkpoints import Shadow


def make_tree(root: Path, files: int, size: int) -> list[Path]:
    made = []
    for number in range(files):
        folder = root / f"d{number % 50:02d}" / f"e{number % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"f{number:05d}.txt"
        path.write_bytes(os.urandom(size // 2).hex().encode())
        made.append(path)
    return made


def timed(work: object) -> float:
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return (time.perf_counter() - started) * 1000


def one(files: int, size: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        workspace = root / "ws"
        made = make_tree(workspace, files, size)
        shadow = Shadow(root / "agent", workspace)
        results: dict[str, str] = {}
        first = timed(lambda: results.update(first=shadow.capture("bench").commit))
        for path in made[:3]:
            path.write_bytes(b"changed\n" + path.read_bytes())
        incremental = timed(lambda: results.update(second=shadow.capture("bench").commit))
        for path in made[100:200]:
            path.write_bytes(b"changed again\n")

        def restore() -> None:
            now = shadow.capture("bench").commit
            shadow.restore(results["second"], now)

        restoring = timed(restore)
        assert made[150].read_bytes() != b"changed again\n"
        return {"first capture": first, "incremental (3 changed)": incremental,
                "restore of 100 changed": restoring}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs = [one(args.files, args.size) for _ in range(args.repeat)]
    print(f"{args.files:,} files of {args.size:,} bytes ({args.files * args.size / 1e6:.0f} MB), "
          f"{args.repeat} runs")
    for what in runs[0]:
        values = [run[what] for run in runs]
        print(f"  {what:26} min {min(values):8.1f} ms  median {statistics.median(values):8.1f} ms"
              f"  max {max(values):8.1f} ms")


if __name__ == "__main__":
    main()
