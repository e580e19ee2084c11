"""The stats file keeps being written while the queue refuses flushes, so an outage shows while it lasts."""
from __future__ import annotations

import json
from pathlib import Path

from tests.dispatcher_rig import SHARDS, ManualClock, Rig, SecondsClock, task_in
from tests.tasks import NINE_OCLOCK_MS

T0 = NINE_OCLOCK_MS


def test_the_stats_file_is_written_every_second_while_the_queue_refuses_flushes(tmp_path: Path) -> None:
    clock = ManualClock(T0 + 10_000)
    stats = tmp_path / "stats.json"
    refusing = {"on": False}
    rig = Rig(tmp_path, "a", clock, SecondsClock(1_000.0), stats_path=stats,
              failing=lambda tasks, now: refusing["on"])
    try:
        for shard in range(SHARDS):
            assert rig.store.take_shard(shard, "gone", 0) and rig.store.advance_shard(shard, 0, clock.now_ms - 1)
        assert rig.store.insert([task_in(0, clock.now_ms + 3_000)]) == []
        rig.take()
        rig.pump_until(lambda: stats.exists(), max_pumps=30, what="the stats file")
        refusing["on"] = True
        rig.pump_until(lambda: rig.publisher.failures, max_pumps=60, what="a refused flush")
        for _ in range(50):  # 5 s of an outage
            rig.pump()
        document = json.loads(stats.read_text())
        assert document["stats"]["publish_failures"] >= 1, document["stats"]
        assert document["at_ms"] >= clock.now_ms - 2_000, (document["at_ms"], clock.now_ms)
    finally:
        rig.close()
