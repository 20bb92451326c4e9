"""Progress on stderr for long runs (a big lint tree, a big log, a snapshot), only on a terminal.

Off a terminal (CI logs, pipes, tests) every method is a no-op, so machine output and logs stay clean.
The bench's own bar (render.bench.BenchProgress) is fed by the ranks' events; this one by the caller.
"""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.render import err_console


class StderrProgress:
    """`with StderrProgress("lint", total=n) as p: ... p.advance(); p.describe("file.py")`.

    total None: a spinner with a count; `unit="bytes"` shows sizes (explain reads by the byte)."""

    def __init__(self, description: str, total: Optional[float] = None, unit: str = "items") -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self._progress: Any = None
        self._task: Any = None

    @property
    def shown(self) -> bool:
        return self._progress is not None

    def __enter__(self) -> StderrProgress:
        con = err_console()
        if not con.is_terminal:
            return self
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        count = DownloadColumn() if self.unit == "bytes" else MofNCompleteColumn()
        columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), count, TimeElapsedColumn()]
        self._progress = Progress(*columns, console=con, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def set_total(self, total: Optional[float]) -> None:
        self.total = total
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def update(self, completed: float) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed)

    def advance(self, amount: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, amount)

    def describe(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=f"{self.description}: {text}"[:80])
