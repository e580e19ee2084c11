"""A progress bar on stderr while a run goes (`Phases`): ingest (tasks stored), the wait
for M (a countdown), the burst (tasks seen) and, with `--workers`, the handling (tasks
done). Only on a terminal: otherwise (a log, a test) every call here does nothing, and
the run's `echo` lines are the whole record, as before. The progress lines `echo`
prints while a bar shows go above it (rich redirects stderr while it is live)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn


class Phases:
    """One bar a phase, each created the first time it is named."""

    def __init__(self, enabled: bool | None = None) -> None:
        console = Console(stderr=True)
        self.enabled = console.is_terminal if enabled is None else enabled
        self._progress = Progress(TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                                  TimeRemainingColumn(), console=console, transient=False) if self.enabled else None
        self._bars: dict[str, TaskID] = {}
        self._totals: dict[str, int] = {}

    def __enter__(self) -> Phases:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def update(self, phase: str, completed: float, total: float) -> None:
        """Set `phase`'s bar to `completed` of `total` (a new bar the first time)."""
        if self._progress is None:
            return
        bar = self._bars.get(phase)
        if bar is None:
            bar = self._bars[phase] = self._progress.add_task(phase, total=total)
        self._progress.update(bar, completed=completed, total=total)

    def countdown(self, phase: str, left_s: float, total_s: float) -> None:
        """A countdown as a bar that fills: `left_s` seconds still to wait, of the
        `total_s` the first call gave (later calls keep that total)."""
        total = self._totals.setdefault(phase, max(1, round(total_s)))
        self.update(phase, min(total, max(0, round(total - left_s))), total)
