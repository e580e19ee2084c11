"""Which offsets a worker may commit: per partition, everything below the oldest
message it has not settled.

Messages of one partition are handled concurrently and finish in any order, but a
commit is a single position: "every message before this one is handled". So the
position only moves past a run of settled messages:

    received 10 11 12 13, settled 10 and 12   -> committable position 11
    then 11 settles                           -> 13 (12 was already settled)
"""

from __future__ import annotations

from collections import deque

from scheduler.ports import TopicPartition


class PartitionProgress:
    """Offsets received from one partition, in order, and which of them are settled."""

    __slots__ = ("_pending", "_settled", "position")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._settled: set[int] = set()
        self.position: int | None = None
        """The offset to resume from, once any message was settled."""

    def received(self, offset: int) -> None:
        self._pending.append(offset)

    def settle(self, offset: int) -> None:
        self._settled.add(offset)
        pending, settled = self._pending, self._settled
        last: int | None = None
        while pending and pending[0] in settled:
            last = pending.popleft()
            settled.discard(last)
        if last is not None:
            self.position = pending[0] if pending else last + 1

    @property
    def outstanding(self) -> int:
        return len(self._pending)


class Progress:
    """`PartitionProgress` of every partition a worker reads, and what to commit."""

    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, PartitionProgress] = {}

    def received(self, partition: TopicPartition, offset: int) -> None:
        progress = self._partitions.get(partition)
        if progress is None:
            progress = self._partitions[partition] = PartitionProgress()
        progress.received(offset)

    def settle(self, partition: TopicPartition, offset: int) -> None:
        progress = self._partitions.get(partition)
        if progress is not None:
            progress.settle(offset)

    def positions(self) -> dict[TopicPartition, int]:
        """The position to commit of every partition that has one."""
        return {partition: progress.position for partition, progress in self._partitions.items()
                if progress.position is not None}

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Drop partitions taken away from this worker: their unsettled messages will be
        delivered to another member, and late settles of them must not be committed."""
        for partition in partitions:
            self._partitions.pop(partition, None)

    def outstanding(self) -> int:
        """Messages received and not yet settled."""
        return sum(p.outstanding for p in self._partitions.values())
