"""Sharded State entries from Python (State.register_shard) end to end:
tests/python/workers/sharded.py under erun on simulated hosts, through a
SIGKILL, a host added and a host lost whole (agent and worker), ends at the
bytes of the same run alone; and the API's errors."""
import os
import re
import signal

import numpy as np
import pytest

import erun
from conftest import PYTHON, host_of, wait_for


def checksum(text):
    m = re.search(r"final checksum=([0-9a-f]+)", text)
    return m.group(1) if m else None


def test_shards_are_resharded_through_a_kill_a_grow_and_a_lost_host(ws):
    alone = ws.python("sharded.py", ["--step-ms", "0"])
    assert alone.wait(120) == 0, alone.out + alone.err
    reference = checksum(alone.out)
    assert reference, alone.out

    ws.hosts("node-a:2\nnode-b:1\n")
    # node-a is not blacklisted by the kill: a blacklisted host keeps its
    # survivors but gets no new worker, and the job would grow to 3, not 4.
    job = ws.erun(["-np", "3", "--min-np", "2", "--max-np", "4", "--blacklist-after", "5"], "sharded.py",
                  discovery=True)
    # Past the first commits: a worker lost before the job's first whole
    # commit ends it (docs/state.md, "Sharded entries").
    assert wait_for(job, r"rank \d committed step 10", 3), job.out + job.err
    victims = [p for p in ws.workers("sharded.py") if host_of(p) == "node-a"]
    assert len(victims) == 2, victims
    os.kill(victims[0], signal.SIGKILL)  # its rows come back from its file on node-a
    assert wait_for(job, r"reset 3 -> [23]"), job.out + job.err
    ws.hosts("node-a:2\nnode-b:1\nnode-c:1\n")  # grow
    assert wait_for(job, r"reset \d -> 4"), job.out + job.err
    on_c = [p for p in ws.workers("sharded.py") if host_of(p) == "node-c"]
    assert len(on_c) == 1, on_c
    # At once, before node-c's first commit is whole: its rows are then only in the
    # copies its sync wrote (its host's file and its buddy's). Those lacked the pieces'
    # table until its first commit, and the job ended in StateLost (1 run in about 12
    # under load); tests/unit/state_shard_test.cc has the deterministic case.
    agent = int(open(f"/proc/{on_c[0]}/stat").read().rsplit(")", 1)[1].split()[1])
    ws.hosts("node-a:2\nnode-b:1\n")
    os.kill(agent, signal.SIGKILL)  # node-c lost whole: its rows are on its buddy, node-a
    os.kill(on_c[0], signal.SIGKILL)
    # "2 -> 3" when the world of 4 made no commit: a reset names the world of the commit it restores.
    assert wait_for(job, r"reset [24] -> 3"), job.out + job.err

    assert job.wait(300) == 0, job.out + job.err
    assert checksum(job.out) == reference, job.out
    assert "cannot be put back together" not in job.err, job.err
    assert ws.wait_no_workers("sharded.py"), ws.workers("sharded.py")


def test_shard_rows_and_register_shard_errors():
    assert erun.shard_rows(10, 3, 4) == (9, 10)
    assert erun.shard_rows(5, 3, 4) == (5, 5)
    assert erun.shard_rows(10, 3, 4, split="even") == (8, 10)
    with pytest.raises(erun.Error, match="split must be 'chunk' or 'even'"):
        erun.shard_rows(10, 0, 1, split="rows")
    state = erun.State()
    x = np.zeros((4, 2))
    with pytest.raises(erun.Error, match="split must be"):
        state.register_shard("x", 4, lambda: x, lambda y: None, split="zero")
    with pytest.raises(erun.Error, match="not C-contiguous"):
        state.register_shard("t", 4, lambda: np.zeros((2, 4)).T, lambda y: None)
    assert issubclass(erun.StateLost, erun.Error)


def test_register_shard_keeps_no_reference_to_a_piece():
    """A reshard frees the old piece: the entry holds only what get() returns."""
    import gc
    import weakref
    state = erun.State()
    held = {"w": np.ones((6, 3))}
    state.register_shard("w", 6, lambda: held["w"], lambda x: held.__setitem__("w", x))
    old = weakref.ref(held["w"])
    held["w"] = np.zeros((6, 3))  # what set(new) does after a reshard
    gc.collect()
    assert old() is None
    state.sync()
    state.commit()
    state.restore()
    assert held["w"].shape == (6, 3) and not held["w"].any()


def lose_hosts_at_once(*workers):
    """Each worker's host lost whole (its agent and it SIGKILLed), all at the same time: every
    one is stopped first, so that none of them takes part in a recovery from another's loss
    (which would copy the lost host's rows onward) before it dies too."""
    procs = []
    for pid in workers:
        procs += [int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]), pid]
    for pid in procs:
        os.kill(pid, signal.SIGSTOP)
    for pid in procs:
        os.kill(pid, signal.SIGKILL)


def test_a_piece_whose_host_and_buddy_are_both_lost_ends_the_job_naming_it(ws):
    """Done means (d), without --checkpoint-dir: three hosts of one slot, the buddy of
    each the next host (node-b's is node-c). node-b and node-c are lost whole at once, so
    node-b's rows have no copy left: the survivor does not train on (no hole, no zeros),
    the job ends with a non-zero status and an error that names the rows."""
    ws.hosts("node-a:1\nnode-b:1\nnode-c:1\n")
    job = ws.erun(["-np", "3", "--min-np", "1", "--max-np", "3"], "sharded.py", ["--steps", "2000"],
                  discovery=True)
    assert wait_for(job, r"rank \d committed step 10", 3), job.out + job.err
    on = {host_of(p): p for p in ws.workers("sharded.py") if host_of(p)}
    assert sorted(on) == ["node-a", "node-b", "node-c"], on
    ws.hosts("node-a:1\n")
    lose_hosts_at_once(on["node-b"], on["node-c"])
    code = job.wait(120)
    assert code not in (0, None), (code, job.out, job.err)
    logs = job.out + job.err
    assert "cannot be put back together" in logs, logs
    assert re.search(r"no living host holds 'w' rows \d+\.\.\d+ of 37", logs), logs
    assert "'m' rows" in logs, logs
    assert "done:" not in job.out, job.out
    assert ws.wait_no_workers("sharded.py")


def test_with_a_checkpoint_dir_a_piece_lost_with_its_buddy_comes_back_from_disk(ws):
    """Done means (d), with --checkpoint-dir: the same double loss as above, but every rank
    also wrote its pieces of each commit there (rank 0 the whole entries once all had): the
    survivor goes on from that durable commit, alone, and ends at the bytes of the run alone."""
    alone = ws.python("sharded.py", ["--step-ms", "0"])
    assert alone.wait(120) == 0, alone.out + alone.err
    reference = checksum(alone.out)
    ckpt = ws.path / "ckpt"
    ws.hosts("node-a:1\nnode-b:1\nnode-c:1\n")
    job = ws.erun(["-np", "3", "--min-np", "1", "--max-np", "3", "--checkpoint-dir", str(ckpt)], "sharded.py",
                  discovery=True)
    assert wait_for(job, r"rank \d committed step 10", 3), job.out + job.err
    on = {host_of(p): p for p in ws.workers("sharded.py") if host_of(p)}
    ws.hosts("node-a:1\n")
    lose_hosts_at_once(on["node-b"], on["node-c"])
    assert job.wait(180) == 0, job.out + job.err
    logs = job.out + job.err
    assert re.search(r"goes on from durable commit \d+", logs), logs
    assert checksum(job.out) == reference, logs
    files = sorted(p.name for p in (ckpt / "erun-shards").iterdir())
    assert any(f.startswith("rank-0.") for f in files), files
    assert all(oct(os.stat(ckpt / "erun-shards" / f).st_mode & 0o777) == "0o600" for f in files), files


def test_a_sharded_job_started_again_goes_on_from_its_durable_commit(ws):
    """A job that ended leaves its last commit in --checkpoint-dir (each rank's pieces and
    the whole entries); the same job started again with more steps and another world size
    resumes there, resharded from the files, and ends at the bytes of one run alone."""
    alone = ws.python("sharded.py", ["--step-ms", "0", "--steps", "160"])
    assert alone.wait(120) == 0, alone.out + alone.err
    ckpt = ws.path / "ckpt"
    first = ws.erun(["-np", "3", "--checkpoint-dir", str(ckpt)], "sharded.py", ["--step-ms", "0", "--steps", "100"])
    assert first.wait(120) == 0, first.out + first.err
    assert "done: 100 steps world 3" in first.out, first.out
    again = ws.erun(["-np", "2", "--checkpoint-dir", str(ckpt)], "sharded.py", ["--step-ms", "0", "--steps", "160"])
    assert again.wait(120) == 0, again.out + again.err
    logs = again.out + again.err
    assert re.search(r"no commit in the hosts' memory; the job goes on from durable commit \d+", logs), logs
    assert "committed step 10" not in again.out, again.out  # it did not start from scratch
    assert checksum(again.out) == checksum(alone.out), logs
