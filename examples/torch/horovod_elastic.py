"""A Horovod elastic PyTorch program, as Horovod's documentation writes one,
running under erun: the only erun line is the import. Synthetic
classification data (so it needs no download), an MLP, SGD with the
learning rate scaled to the world size, a commit every --commit-every
batches.

    erun -np 2 python examples/torch/horovod_elastic.py
    erun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover_hosts.sh \\
        python examples/torch/horovod_elastic.py --epochs 20

Change the discovery script's hosts or kill a worker while it trains: the
survivors keep their process, go back to the last commit and go on (see
docs/horovod.md). The same file runs under horovodrun with
`import horovod.torch as hvd`.
"""
import argparse

import torch
import torch.nn.functional as F

import erun.horovod.torch as hvd


def synthetic(samples, classes=4):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 16, generator=g)
    y = (x[:, :classes] + 0.3 * x[:, classes:2 * classes]).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--commit-every", type=int, default=8)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(42)
    dataset = synthetic(args.samples)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    train_sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    train_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler)

    def on_state_reset():
        for param_group in optimizer.param_groups:
            param_group["lr"] = args.lr * hvd.size()

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, train_sampler=train_sampler, epoch=0,
                                   batch=0)
    state.register_reset_callbacks([on_state_reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            state.train_sampler.set_epoch(state.epoch)
            correct = torch.zeros(2)
            for batch_idx, (data, target) in enumerate(train_loader):
                optimizer.zero_grad()
                output = model(data)
                loss = F.cross_entropy(output, target)
                loss.backward()
                optimizer.step()
                correct += torch.tensor([float((output.argmax(dim=1) == target).sum()), float(len(target))])
                state.train_sampler.record_batch(batch_idx, args.batch_size)
                state.batch = batch_idx
                if batch_idx % args.commit_every == 0:
                    state.commit()
            correct = hvd.allreduce(correct, op=hvd.Sum, name="accuracy")
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: world {hvd.size()} train accuracy "
                      f"{correct[0] / max(correct[1], 1):.3f}", flush=True)
            state.batch = 0
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print(f"done: {args.epochs} epochs", flush=True)


if __name__ == "__main__":
    main()
