"""Progress of long work: a bar with an ETA on a terminal, plain lines elsewhere.

Long work reports `progress(description, done, total, task=None)`. Reports that name the same
`task` are one piece of work, each with its own description (a study's units: `UNITS`, "seed
5: FP(C) session 3"); without a task each description is its own (generating data, reading
frames). On a terminal a rich progress bar shows each task; when stderr is not a terminal
(nohup, a batch scheduler's log), a plain line is printed when a task starts, at every 5% of
it or every 30 s, and when it ends, with the elapsed time and an ETA.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

PLAIN_EVERY_SECONDS = 30.0
PLAIN_EVERY_FRACTION = 0.05
UNITS = "units"  # the task of a study's units (`fedcare.studies.base.StudyProtocol.advance`)


class Report(Protocol):
    def __call__(self, description: str, done: int, total: int, task: str | None = None) -> None:
        """`done` of `total` of the work `description` says; `task` groups reports into one piece of work."""


def task_key(description: str, task: str | None) -> str:
    return task or description


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


@dataclass
class _Task:
    started: float
    first_done: int  # units done at the task's first report (a resumed run starts with some)
    last_print: float = 0.0
    last_fraction: float = -1.0
    extra: dict = field(default_factory=dict)


class PlainProgress:
    """Plain progress lines with an ETA, for output that is not a terminal."""

    def __init__(self, stream=None, clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.tasks: dict[str, _Task] = {}

    def __call__(self, description: str, done: int, total: int, task: str | None = None) -> None:
        now = self.clock()
        key = task_key(description, task)
        task = self.tasks.get(key)
        if task is None:  # its first report: the rate is measured from here
            task = self.tasks[key] = _Task(started=now, first_done=done)
        fraction = done / total if total else 1.0
        due = (now - task.last_print >= PLAIN_EVERY_SECONDS or fraction - task.last_fraction >= PLAIN_EVERY_FRACTION
               or done >= total or task.last_print == 0.0)
        if not due:
            return
        task.last_print, task.last_fraction = now, fraction
        elapsed = now - task.started
        line = f"[{done}/{total}] {100 * fraction:3.0f}% {description} (elapsed {duration(elapsed)}"
        new = done - task.first_done
        if 0 < new and done < total:
            line += f", ETA {duration(elapsed / new * (total - done))}"
        print(line + ")", file=self.stream, flush=True)


@contextmanager
def progress_reporter(console: Console) -> Iterator[Report]:
    """A progress callback for `console` (stderr): a bar on a terminal, plain lines otherwise."""
    if not console.is_terminal:
        yield PlainProgress(console.file)
        return
    bar = Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
    )
    tasks: dict[str, int] = {}

    def report(description: str, done: int, total: int, task: str | None = None) -> None:
        key = task_key(description, task)
        if key not in tasks:
            tasks[key] = bar.add_task(escape(description), total=total)
        bar.update(tasks[key], completed=done, total=total, description=escape(description))

    with bar:
        yield report
