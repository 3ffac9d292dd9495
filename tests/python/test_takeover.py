"""A PyTorch job outlives its erun (--driver-grace): train_exact.py (TorchState,
float64 parameters, exact gradient sums) under erun, erun SIGKILLed after the
first epoch, the same command run again 2 s later. The workers keep their
processes through the gap and under the new erun, every epoch sees every
sample exactly once, and the job ends at the uninterrupted run's checksum
(bit-identical parameters)."""
import signal
import time

from test_elastic import ARGS, EPOCHS, checksum, reference  # noqa: F401 (reference is a fixture)


def test_erun_sigkilled_and_run_again_takes_the_torch_job_over_in_place(ws, reference):
    env = {"ERUN_JOB_DIR": str(ws.path / "jobs")}
    args = ["--driver-grace", "60", "--job-name", "torch-takeover", "-np", "2"]
    script_args = ARGS + ["--step-ms", "100"]
    first = ws.erun(args, "train_exact.py", script_args, env=env)
    assert first.wait_output(r"epoch 0 ", 180), first.out + first.err
    before = set(ws.workers("train_exact.py")) - {first.proc.pid}  # erun's argv names the script too
    assert len(before) == 2, before
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    time.sleep(2)
    assert set(ws.workers("train_exact.py")) == before, "a worker ended with its erun"

    again = ws.erun(args, "train_exact.py", script_args, env=env)
    assert again.wait_output(r"took the job over", 60, stream="err"), again.err
    assert set(ws.workers("train_exact.py")) - {again.proc.pid} == before, "the new erun did not keep the workers"
    code = again.wait(300)
    assert code == 0, again.out + again.err
    assert checksum(again.out) == reference, again.out
    out = first.out + again.out
    assert out.count("exactly-once=yes") == EPOCHS, out
    assert "exactly-once=NO" not in out
    assert ws.wait_no_workers("train_exact.py"), ws.workers("train_exact.py")
