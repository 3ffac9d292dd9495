"""Ctrl-C (SIGINT) during a blocked collective raises KeyboardInterrupt at
once (the communicator is aborted), well before the collective timeout."""
import os
import re
import signal

from conftest import ERUN, PYTHON


def test_sigint_interrupts_a_blocked_barrier(ws):
    job = ws.start([str(ERUN), "-np", "2", "--collective-timeout", "60", PYTHON, ws.script("interrupt.py")])
    assert job.wait_output(r"pid \d+ waiting", 120), job.out + job.err
    pid = int(re.search(r"pid (\d+) waiting", job.out).group(1))
    os.kill(pid, signal.SIGINT)
    assert job.wait_output(r"interrupted after", 15), job.out + job.err
    took = float(re.search(r"interrupted after ([0-9.]+) s", job.out).group(1))
    assert took < 10, job.out
    assert "barrier returned" not in job.out
