"""A torch.compile'd model under the real erun: a worker that joins a running
job receives the model and optimizer state from the survivor, whether the
survivor gave TorchState the compiled module and the newcomer the original
one, or the other way round (their state_dict keys differ by torch.compile's
"_orig_mod." prefix); both then train in step (DistributedOptimizer with
overlapped GradientHooks) and end with the same parameters. torch 2.x only."""
import re

import pytest
import torch

pytestmark = pytest.mark.skipif(not hasattr(torch, "compile"),
                                reason=f"torch {torch.__version__} has no torch.compile (2.0 and later)")


@pytest.mark.parametrize("first", ["compiled", "original"])
def test_a_newcomer_gets_the_state_of_a_compiled_model(ws, first):
    ws.hosts("node-a:1\n")
    job = ws.erun(["-np", "1", "--min-np", "1", "--max-np", "2"], "compiled_train.py", ["--first", first],
                  discovery=True)
    # The first worker trains alone (compiled: the first step waits for inductor) ...
    assert job.wait_output(r"pid \d+ rank 0 size 1 given " + first, 300), job.out + job.err
    assert job.wait_events("generation_joined", 1, 60), job.err
    ws.hosts("node-a:1\nnode-b:1\n")  # ... until a second one joins it
    assert job.wait(300) == 0, job.out + job.err
    assert ws.wait_no_workers("compiled_train.py")

    initial = dict(re.findall(r"pid (\d+) initial checksum ([0-9a-f]+)", job.out))
    assert len(initial) == 2 and len(set(initial.values())) == 2, job.out  # each its own model
    entries = re.findall(r"pid (\d+) rank (\d) size 2 given (\w+) step (\d+) checksum ([0-9a-f]+)", job.out)
    other = "original" if first == "compiled" else "compiled"
    # The first entry in the world of 2: the same step and parameters on both ranks, the
    # newcomer's (given the other module) replaced by the survivor's.
    grown = {}
    for pid, rank, given, step, c in entries:
        grown.setdefault(pid, (rank, given, int(step), c))
    assert len(grown) == 2, job.out
    (survivor, s), (newcomer, n) = sorted(grown.items(), key=lambda kv: kv[1][0])
    assert s[1] == first and n[1] == other, (s, n)
    assert s[2] == n[2] > 0 and s[3] == n[3], (s, n)
    assert n[3] != initial[newcomer], (n, initial)
    final = re.findall(r"pid (\d+) rank \d final checksum ([0-9a-f]+)", job.out)
    assert len(final) == 2 and final[0][1] == final[1][1], job.out
    assert "hosts updated at commit" in job.out + job.err
