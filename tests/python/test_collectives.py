"""Every collective on every dtype and op against a serial reference, with
real worker processes under the built erun (2 and 4 ranks), under mpirun,
and alone (a world of one)."""
import re
import shutil
import subprocess

import pytest

from conftest import PYTHON


def passed(job, n):
    lines = re.findall(r"collectives ok rank (\d+) of (\d+) checks (\d+)", job.out)
    assert sorted(int(r) for r, _, _ in lines) == list(range(n)), job.out + job.err
    assert all(int(s) == n and int(c) > 250 for _, s, c in lines), job.out  # with reduce_scatter's


@pytest.mark.parametrize("np_", [2, 4])
def test_collectives_under_erun(ws, np_):
    job = ws.erun(["-np", str(np_)], "collectives.py")
    assert job.wait(240) == 0, job.out + job.err
    passed(job, np_)
    assert ws.wait_no_workers("collectives.py")


def test_collectives_alone(ws):
    job = ws.python("collectives.py")
    assert job.wait(120) == 0, job.out + job.err
    passed(job, 1)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_collectives_under_mpirun(ws):
    job = ws.start(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH",
                    PYTHON, ws.script("collectives.py")])
    assert job.wait(240) == 0, job.out + job.err
    passed(job, 2)
