"""Plant a one-line bug in a module, run the module's own test file, and put the line back: a
test file should fail when its module is wrong (tests/README.md).

    python tests/plant.py FILE OLD NEW TEST_FILE   # replace the one line holding OLD
    python tests/plant.py --recorded [NAME ...]     # replay the plants recorded below

OLD must occur exactly once in FILE; the line holding it gets NEW in its place. The test file
runs with ``pytest -x`` under a time limit; a failure or a timeout counts as caught. The file
is restored whatever happens (also on Ctrl-C), and the script checks that it was. Exit 0 when
every plant was caught, 1 when one was missed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Plant(NamedTuple):
    name: str
    file: str
    old: str
    new: str
    tests: str


# The slips each module's own test file must catch (issue 21 and the reviews after it): add a
# row when a test is written for a bug a test file missed.
RECORDED = [
    Plant("checkpoint: first strip's column index 0", "disttensor/checkpoint/files.py",
          "first = (r0 // rt, c0 // cw)", "first = (r0 // rt, 0)", "tests/test_checkpoint.py"),
    Plant("checkpoint: span's single-band rule without rt == 1", "disttensor/checkpoint/tiles.py",
          "rt == 1", "True", "tests/test_checkpoint.py"),
    Plant("agree: the kind dropped from the fingerprint", "disttensor/comm/agree.py",
          'text = f"{kind}{key!r}".encode()', 'text = f"{key!r}".encode()',
          "tests/test_agree.py"),
    Plant("agree: the root dropped from broadcast's key", "disttensor/comm/base.py",
          '(buf.dtype, buf.size, "root", root)', "(buf.dtype, buf.size)", "tests/test_agree.py"),
    Plant("agree: iallreduce checked as a blocking all_reduce", "disttensor/comm/base.py",
          'self._agree_before("iall_reduce"', 'self._agree_before("all_reduce"',
          "tests/test_agree.py"),
    Plant("mutation: a negative step's stop at a shard start", "disttensor/ops/mutation.py",
          "stop if stop >= 0 else None", "stop if stop > 0 else None", "tests/test_mutation.py"),
    Plant("indexing: nested-split owner lengths", "disttensor/ops/indexing.py",
          "length = q + (c < r)", "length = q + (c <= r)", "tests/test_indexing.py"),
    Plant("scan: a reverse scan's carried total from the wrong end", "disttensor/ops/scan.py",
          "[0 if reverse else n - 1]", "[n - 1]", "tests/test_scan_stats.py"),
    Plant("scan: a reverse scan's added region", "disttensor/ops/scan.py",
          "slice(p + 1, None) if reverse else slice(0, p)", "slice(0, p)",
          "tests/test_scan_stats.py"),
    Plant("host kernels: a C program that does not compile (the compiled tests skip)",
          "kernels/softmax.c", "const T masked = (T)0 / sum;", "const T masked = (T)0 / sum",
          "tests/test_host_kernels.py"),
]  # fmt: skip


def plant(file: str, old: str, new: str, tests: str, timeout: float, k: str = "") -> str:
    """ "caught", "caught (timeout)" or "missed": the test file's verdict with the plant in."""
    path = ROOT / file
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{file}: {old!r} occurs {text.count(old)} times, not once")
    start = text.rfind("\n", 0, text.index(old)) + 1
    end = text.find("\n", text.index(old))
    end = len(text) if end < 0 else end
    line = text[start:end]
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", tests]
    if k:
        cmd += ["-k", k]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    try:
        path.write_text(text[:start] + line.replace(old, new) + text[end:])
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "caught (timeout)"
        if done.returncode in (2, 3, 4):  # interrupted, internal or usage error: no verdict
            out = done.stdout.decode()[-2000:]
            raise SystemExit(f"pytest could not run {tests} (exit {done.returncode}):\n{out}")
        return "missed" if done.returncode in (0, 5) else "caught"
    finally:
        path.write_text(text)
        assert path.read_text() == text, f"{file} was not restored"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("args", nargs="*", help="FILE OLD NEW TEST_FILE, or names with --recorded")
    p.add_argument("--recorded", action="store_true", help="replay the recorded plants")
    p.add_argument("-k", default="", help="pytest -k expression for the test file")
    p.add_argument("--timeout", type=float, default=600, help="seconds per test file run")
    a = p.parse_args(argv)
    if a.recorded:
        chosen = [r for r in RECORDED if not a.args or any(n in r.name for n in a.args)]
        plants = [(r.name, r.file, r.old, r.new, r.tests) for r in chosen]
    elif len(a.args) == 4:
        plants = [(f"{a.args[0]}: {a.args[1]!r} -> {a.args[2]!r}", *a.args)]
    else:
        p.error("give FILE OLD NEW TEST_FILE, or --recorded")
    missed = 0
    for name, file, old, new, tests in plants:
        t0 = time.perf_counter()
        verdict = plant(file, old, new, tests, a.timeout, a.k)
        missed += verdict == "missed"
        print(f"{verdict:17} {time.perf_counter() - t0:6.1f} s  {name}  ({tests})", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
