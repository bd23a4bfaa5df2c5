"""The bad-input and fault table (tests/fault_table.py) on simulated ranks and under mpiexec.

Every cheap row runs on 2 and 3 simulated ranks in process, and under mpiexec in one launch
per world size that runs all of them in sequence (its verdict lines are parsed here, one test
per row and world). Each job-ending program is a launch of its own. A row that shows a known
library bug carries ``xfail`` (strict: it must fail until the bug is fixed).
"""

from __future__ import annotations

import re
import time

import fault_cases  # noqa: F401  (registers the rows of both row modules)
import pytest
from fault_table import EXITS, ROWS, run_row
from mpirun import run

import disttensor as dt

WORLDS = (2, 3)
BY_NAME = {row.name: row for row in ROWS}
VERDICT = re.compile(r"^ROW (\S+) (PASS|FAIL) \d+ ms (.*)$", re.M)


def _rows() -> list:
    """Row names as parameters, the known bugs marked strict xfail with their reason."""
    return [
        pytest.param(r.name, marks=pytest.mark.xfail(strict=True, reason=r.xfail))
        if r.xfail
        else r.name
        for r in ROWS
    ]


def test_the_table_is_large_and_its_names_unique():
    assert len(ROWS) >= 60 and len(BY_NAME) == len(ROWS)
    assert len({e.name for e in EXITS}) == len(EXITS) >= 5


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", _rows())
def test_row_on_simulated_ranks(name, world):
    row = BY_NAME[name]
    results = dt.simulate(world, lambda: run_row(row, world), timeout=10)
    verdict, why, in_step = results[0]
    assert results == [results[0]] * world, results  # every rank judged the same outcomes
    assert in_step, why
    assert verdict == "PASS", why


# -- under mpiexec: one launch per world size runs every row ----------------------------------
_launches: dict[int, tuple[int | None, dict[str, tuple[str, str]], str]] = {}


def _table(world: int) -> tuple[int | None, dict[str, tuple[str, str]], str]:
    """(exit code, {row: (verdict, why)}, output) of the launch on ``world`` ranks, made once;
    a launch that hung is remembered as such (exit code None), not retried per row."""
    if world not in _launches:
        # a row that leaves a rank waiting ends the launch in seconds, naming the call
        env = {"DISTTENSOR_TIMEOUT": "10"}
        try:
            code, out = run(world, ["tests/fault_cases.py"], timeout=120, env=env)
        except TimeoutError as e:
            code, out = None, str(e)
        verdicts = {m[1]: (m[2], m[3]) for m in VERDICT.finditer(out)}
        _launches[world] = (code, verdicts, out)
    return _launches[world]


@pytest.mark.mpi
@pytest.mark.parametrize("world", WORLDS)
def test_table_launch_ends_cleanly(world):
    code, verdicts, out = _table(world)
    assert code == 0, out[-4000:]
    assert f"TABLE {len(ROWS)} rows on {world} ranks" in out, out[-4000:]
    assert set(verdicts) == set(BY_NAME), out[-4000:]


@pytest.mark.mpi
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", _rows())
def test_row_under_mpiexec(name, world):
    code, verdicts, out = _table(world)
    assert name in verdicts, f"no verdict: the launch ended (exit {code}) first:\n{out[-4000:]}"
    verdict, why = verdicts[name]
    assert verdict == "PASS", why


# -- programs that end the whole job: a launch each --------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("job", EXITS, ids=lambda e: e.name)
def test_job_ending_program(job):
    start = time.perf_counter()
    code, out = run(job.world, ["tests/fault_cases.py", "exit", job.name], timeout=60, env=job.env)
    took = time.perf_counter() - start
    assert code != 0 if job.code is None else code == job.code, f"exit code {code}:\n{out}"
    for text in job.says:
        assert text in out, f"{text!r} is not in the output:\n{out}"
    for text in job.absent:
        assert text not in out, f"{text!r} is in the output:\n{out}"
    # far below DISTTENSOR_TIMEOUT (300 s): the job ended, it did not time out; the margin is
    # for launches on a loaded machine (the suite runs two workers)
    assert took < 30, f"the job took {took:.1f} s to end (launch included):\n{out}"
