"""Horovod's ``hvd.elastic.ElasticSampler`` over erun.torch's.

``ElasticSampler(dataset, shuffle=True, seed=0)`` gives this rank its share
of the epoch's remaining samples (every size-th, starting at its rank);
``record_batch(batch_idx, batch_size)`` after each step marks the step's
samples of every rank processed. Its position (epoch, samples processed) is
committed with the elastic state it is given to, and after a re-join the
remaining samples are split over the new world, so every sample of an epoch
is trained once across resizes and failures. ``set_epoch(e)`` with the
epoch in progress keeps its progress (Horovod's starts the epoch over).
When the remaining samples do not split evenly, the shorter shares are
padded with the epoch's first remaining samples so that every rank runs the
same number of steps, as Horovod's sampler does.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Sequence, Union

from erun import _core
from erun.torch import ElasticSampler as _ErunSampler


class ElasticSampler(_ErunSampler):
    def __init__(self, dataset: Union[int, Sequence[Any]], shuffle: bool = True, seed: int = 0) -> None:
        self._iteration: List[int] = []  # this rank's samples of the current iteration
        self._base = 0       # the remaining samples of all ranks when it began
        self._recorded = 0   # of them, recorded since
        super().__init__(dataset, batch_size=1, shuffle=shuffle, seed=seed)  # splits: _reset_world()

    def _reset_world(self) -> None:
        super()._reset_world()
        self._begin_iteration()

    def _begin_iteration(self) -> None:
        n, r = _core.size(), _core.rank()
        remaining = self._c.remaining
        mine = list(self._c.indices())
        share = -(-remaining // n)
        if len(mine) < share:  # pad as Horovod does, so that every rank runs the same steps
            self._c.reset(0, 1)
            everyone = list(self._c.indices())
            self._c.reset(r, n)
            padded = everyone + everyone[:share * n - remaining]
            mine = padded[r::n]
        self._iteration = mine
        self._base = remaining
        self._recorded = 0

    def __iter__(self) -> Iterator[int]:
        self._begin_iteration()
        return iter(list(self._iteration))

    def __len__(self) -> int:
        return len(self._iteration)

    def reset(self) -> None:
        """Splits the remaining samples over the current world again."""
        self._reset_world()

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        """This rank's samples of batch batch_idx of the current iteration."""
        return self._iteration[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:  # type: ignore[override]
        """Marks batch batch_idx (of batch_size samples per rank) of the
        current iteration processed on every rank, with every earlier batch."""
        done = min((int(batch_idx) + 1) * int(batch_size) * _core.size(), self._base)
        if done > self._recorded:
            self._c.record_batch(done - self._recorded)
            self._recorded = done

    def record_indices(self, indices: Sequence[int]) -> None:
        raise NotImplementedError("erun.horovod: ElasticSampler.record_indices is not supported: erun counts an "
                                  "epoch's progress in whole steps; call record_batch(batch_idx, batch_size)")

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "processed": self.processed}

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch`; with the epoch in progress, keeps its progress."""
        super().set_epoch(epoch)
        self._begin_iteration()
