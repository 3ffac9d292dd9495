"""Recovery benchmark worker written with the erun Python package: the
erun.torch twin of bench/step_worker.cc (same output, parsed by bench.py).
Each step sleeps --step-ms, sum-allreduces --floats floats of a torch tensor
through erun, steps a small torch model and commits its TorchState
(model, SGD momentum, step) every --commit-every steps; then prints
    STEP pid=P host=H rank=R size=S gen=G step=N t=SECONDS
A START line is printed before `import torch`.
"""
import argparse
import os
import time

print(f"START pid={os.getpid()} t={time.time():.6f}", flush=True)

import torch  # noqa: E402

import erun  # noqa: E402
import erun.torch  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--step-ms", type=int, default=50)
    p.add_argument("--commit-every", type=int, default=1)
    p.add_argument("--floats", type=int, default=1024)
    a = p.parse_args()
    torch.set_num_threads(1)
    erun.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = erun.torch.TorchState(model=model, optimizer=opt, step=0)
    grad = torch.ones(a.floats)

    @erun.run
    def train(state):
        while state.step < a.steps:
            time.sleep(a.step_ms / 1000)
            grad.fill_(1.0)
            erun.allreduce_(grad, op=erun.Sum)
            for q in model.parameters():
                q.grad = torch.full_like(q, 1e-3)
            opt.step()
            state.step += 1
            def done() -> None:
                print(f"STEP pid={os.getpid()} host={erun.host()} rank={erun.rank()} size={erun.size()} "
                      f"gen={erun.generation()} step={state.step} t={time.time():.6f}", flush=True)
            if state.step % a.commit_every == 0:
                try:
                    state.commit()
                except erun.HostsUpdated:
                    done()  # the step is committed; new members join before the next one
                    raise
            done()

    train(state)


if __name__ == "__main__":
    main()
