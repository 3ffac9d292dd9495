"""The examples in examples/torch run under erun with two ranks (small sizes):
the ToyModel DDP script, the MNIST-sized CNN, whose epoch ends with a step
in which one rank has no sample (ElasticSampler.batches yields None there),
and the Horovod elastic program (erun.horovod.torch)."""
import re

from conftest import ERUN, PYTHON, SOURCE


def test_elastic_ddp_example(ws):
    job = ws.start([str(ERUN), "-np", "2", PYTHON, str(SOURCE / "examples/torch/elastic_ddp.py"),
                    "--steps", "200", "--step-ms", "0"])
    assert job.wait(240) == 0, job.out + job.err
    assert "done: 200 steps" in job.out and "step 200 world 2" in job.out, job.out


def test_mnist_example_with_dataloader_workers_and_an_uneven_last_step(ws):
    # 897 = 7 * (64 * 2) + 1: the last step has one sample, for rank 0 only.
    job = ws.start([str(ERUN), "-np", "2", PYTHON, str(SOURCE / "examples/torch/mnist_synthetic.py"),
                    "--epochs", "2", "--samples", "897", "--batch", "64", "--workers", "2"])
    assert job.wait(300) == 0, job.out + job.err
    epochs = re.findall(r"epoch (\d): world 2 accuracy ([0-9.]+) \((\d+) steps", job.out)
    assert [e[0] for e in epochs] == ["0", "1"], job.out
    assert all(int(e[2]) == 8 for e in epochs), job.out
    assert float(epochs[-1][1]) > 0.3, job.out  # well above chance (0.1)



def test_horovod_elastic_example(ws):
    job = ws.start([str(ERUN), "-np", "2", PYTHON, str(SOURCE / "examples/torch/horovod_elastic.py"),
                    "--epochs", "2", "--samples", "1024"])
    assert job.wait(240) == 0, job.out + job.err
    accuracy = re.findall(r"epoch (\d): world 2 train accuracy ([0-9.]+)", job.out)
    assert [a[0] for a in accuracy] == ["0", "1"], job.out
    assert float(accuracy[-1][1]) > 0.4, job.out  # learning (chance: 0.25)
    assert "done: 2 epochs" in job.out
