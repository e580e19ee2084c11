"""Results day, scaled to a laptop: who submits what, and when. Pure: no I/O.

At `results_at` a state board's results go out as SMS, `batch` to a task (the way a
board submits 2 million as 4,000 tasks of 500), each task costing its SMS against the
provider's limit of `sms_rate` a second. A small college books its exam reminders for
`reminder_delay_s` later, while the board's SMS are still draining at that limit: the
reminders go out on time all the same. One reminder goes to a number the provider
cannot reach: it is retried with backoff and ends in the dead-letter list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from scheduler.model import from_ms
from scheduler.producer import Submission

from .gateway import UNREACHABLE

BOARD = "state-board"
COLLEGE = "city-college"
RESULT_TYPE = "result_sms"
REMINDER_TYPE = "reminder"


@dataclass(frozen=True)
class Story:
    results: int = 20_000
    """Result SMS the board sends."""
    batch: int = 250
    """SMS per board task: its cost. Two dispatchers hold half of `sms_rate` each, and a
    task fits within a second of that (250 of 250)."""
    reminders: int = 50
    """Exam reminders the college books (one task each)."""
    reminder_delay_s: float = 30.0
    """How long after the results the reminders are due."""
    sms_rate: float | None = 500.0
    """The provider's limit, SMS a second across every tenant (None: no limit)."""
    seed: int = 20261203

    def __post_init__(self) -> None:
        if self.results < 1 or not 1 <= self.batch <= 1000 or self.reminders < 2 or self.reminder_delay_s < 5 \
                or (self.sms_rate is not None and self.sms_rate <= 0):
            raise ValueError("results >= 1, batch 1 to 1000, reminders >= 2, reminder delay >= 5 s, SMS rate > 0")

    @property
    def board_tasks(self) -> int:
        return -(-self.results // self.batch)

    def plan(self, results_at_ms: int) -> list[Submission]:
        """Every submission of the story: the board's batches, then the college's reminders
        (the last of which is the undeliverable one)."""
        rng = random.Random(self.seed)
        results_at = from_ms(results_at_ms)
        items: list[Submission] = []
        roll = 0
        for batch_no in range(self.board_tasks):
            size = min(self.batch, self.results - batch_no * self.batch)
            messages = []
            for _ in range(size):
                roll += 1
                messages.append({"to": f"+9198{rng.randrange(10**8):08d}",
                                 "text": f"Roll {roll:07d}: your result is out at results.example.in"})
            items.append(Submission(RESULT_TYPE, {"messages": messages}, tenant=BOARD, run_at=results_at,
                                    idempotency_key=f"results-{batch_no}", cost=size))
        reminders_at = from_ms(results_at_ms + int(self.reminder_delay_s * 1000))
        for n in range(self.reminders):
            to = UNREACHABLE if n == self.reminders - 1 else f"+9197{rng.randrange(10**8):08d}"
            items.append(Submission(REMINDER_TYPE, {"to": to, "text": "Exam tomorrow 09:30, hall B. Bring your ID."},
                                    tenant=COLLEGE, run_at=reminders_at, priority="high",
                                    idempotency_key=f"reminder-{n}", max_attempts=3))
        return items

    def expected_sms(self) -> int:
        """Messages that should reach the provider: every result and every reminder but the doomed one."""
        return self.results + self.reminders - 1
