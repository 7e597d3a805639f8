"""Each rank's share of the training data: a global batch split evenly over the ranks
(:func:`local_batch_size`) and a ``DistributedSampler`` loader that reshuffles every
epoch, the same way on every rank (:class:`ShardedLoader`)."""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from . import env


def local_batch_size(batch_size: int, world_size: int | None = None) -> int:
    """Per-rank batch of a configured global ``batch_size``; it must divide evenly."""
    world = env.get_world_size() if world_size is None else int(world_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch size must be a positive integer, got {batch_size!r}")
    if batch_size % world:
        lo = batch_size // world * world
        options = f"{lo} or {lo + world}" if lo else f"{world}"
        raise ValueError(
            f"the global batch size {batch_size} is not divisible by the world size {world}: "
            f"every process must take the same number of examples per step; use a multiple "
            f"of {world} (e.g. {options}) or a different number of processes"
        )
    return batch_size // world


class ShardedLoader:
    """A ``DataLoader`` over this rank's shard (``DistributedSampler``), global batch in.

    Iterating it advances the sampler's epoch (a new shuffle each pass, the same on
    every rank); :meth:`set_epoch` fixes it explicitly (resuming).  With one process it
    is a seeded shuffled loader over the whole data set.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        num_workers: int = 0,
    ):
        world, rank = env.get_world_size(), env.get_rank()
        self.global_batch_size = int(batch_size)
        self.batch_size = local_batch_size(batch_size, world)
        if len(dataset) < world:
            raise ValueError(f"the data set has {len(dataset)} examples, fewer than {world} ranks")
        self.sampler = DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.dataset = dataset
        self.loader = DataLoader(
            dataset, batch_size=self.batch_size, sampler=self.sampler, num_workers=num_workers
        )
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)
