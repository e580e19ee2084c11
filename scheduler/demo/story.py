"""Results day, scaled to a laptop: who submits what, and when. Pure: no I/O.

At `results_at` a state board's results day starts, as a workflow (`workflow`): its
marksheets are rendered `batch` results at a time (the way a board renders 2 million
as 4,000 batches of 500), each batch's SMS are sent once that batch is rendered, each
send costing its SMS against the provider's limit of `sms_rate` a second, and once
every batch is sent the board's office gets a delivery report. A small college books
its exam reminders (`plan`) for `reminder_delay_s` later, while the board's SMS are
still draining at that limit: the reminders go out on time all the same. One reminder
goes to a number the provider cannot reach: it is retried with backoff and ends in the
dead-letter list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from scheduler.model import from_ms
from scheduler.producer import Submission
from scheduler.workflows import Step, Workflow

from .gateway import UNREACHABLE

BOARD = "state-board"
COLLEGE = "city-college"
RENDER_TYPE = "render_results"
RESULT_TYPE = "result_sms"
REPORT_TYPE = "delivery_report"
REMINDER_TYPE = "reminder"
WORKFLOW_ID = "results-day"
OFFICE = "+919800000000"
"""The board's office, which gets the delivery report."""


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

    def batch_size(self, batch_no: int) -> int:
        return min(self.batch, self.results - batch_no * self.batch)

    def batch_messages(self, batch_no: int) -> list[dict[str, str]]:
        """The result SMS of one batch, the same every time (its own seeded generator):
        what the batch's send step sends, and what the demo reconciles."""
        rng = random.Random(f"{self.seed}:{batch_no}")
        first = batch_no * self.batch
        return [{"to": f"+9198{rng.randrange(10**8):08d}",
                 "text": f"Roll {first + n + 1:07d}: your result is out at results.example.in"}
                for n in range(self.batch_size(batch_no))]

    def workflow(self) -> Workflow:
        """The board's results day: render each batch, send each batch's SMS once it is
        rendered (the send reads the render's result), report once every batch is sent.
        Every send costs a full batch (`batch`) against the rate limit."""
        story = {"results": self.results, "batch": self.batch, "seed": self.seed}
        return Workflow(BOARD, [
            Step("render", RENDER_TYPE, payloads=[{"batch": n, "size": self.batch_size(n)}
                                                  for n in range(self.board_tasks)]),
            Step("send", RESULT_TYPE, each_of="render", payload={"story": story}, cost=self.batch),
            Step("report", REPORT_TYPE, after=["send"], payload={"to": OFFICE}),
        ], workflow_id=WORKFLOW_ID)

    def plan(self, results_at_ms: int) -> list[Submission]:
        """The college's reminders, the last of which is the undeliverable one (the
        board's results day is a workflow: `workflow`)."""
        rng = random.Random(self.seed)
        items: list[Submission] = []
        reminders_at = from_ms(results_at_ms + int(self.reminder_delay_s * 1000))
        for n in range(self.reminders):
            to = UNREACHABLE if n == self.reminders - 1 else f"+9197{rng.randrange(10**8):08d}"
            items.append(Submission(REMINDER_TYPE, {"to": to, "text": "Exam tomorrow 09:30, hall B. Bring your ID."},
                                    tenant=COLLEGE, run_at=reminders_at, priority="high",
                                    idempotency_key=f"reminder-{n}", max_attempts=3))
        return items

    def expected_sms(self) -> int:
        """Messages that should reach the provider: every result, the delivery report, and
        every reminder but the doomed one."""
        return self.results + 1 + self.reminders - 1

    @property
    def board_steps(self) -> int:
        """Tasks of the board's workflow: a render and a send per batch, one report."""
        return 2 * self.board_tasks + 1
