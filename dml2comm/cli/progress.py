"""Progress on the terminal: the parallel work's bar (:func:`progress_bar`: trace ranks, calibration
traces, validation steps) and a site build's layouts bar and lines (:class:`SiteProgress`, given to
:func:`dml2comm.site.build.build`).  Drawn on stderr only when it is a terminal: pipes, files and
tests stay clean."""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["SiteProgress", "progress_bar", "progress_console", "site_progress"]


def progress_console(progress: Any = None) -> Any:
    """Where a build reports progress: ``progress`` itself when it is a rich ``Console``; for
    ``None`` (the default) a console on stderr when stderr is a terminal; else None (silent)."""
    if progress is None:
        if not sys.stderr.isatty():
            return None
        from rich.console import Console

        return Console(stderr=True)
    return progress or None


class SiteProgress:
    """A site build's progress (:class:`dml2comm.site.build.SiteProgress`) on ``console``: the
    layouts' progress bar and the build's lines (a no-op without a console)."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.bar: Any = None
        self.task: Any = None

    def layout(self, done: int, total: int) -> None:
        if self.console is None:
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("Graphviz layouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("layouts", total=total)
        self.bar.update(self.task, completed=done)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)


def site_progress(progress: Any = None) -> SiteProgress:
    """The progress reporter of a site build on :func:`progress_console` ``(progress)``."""
    return SiteProgress(progress_console(progress))


def progress_bar(label: str, enabled: bool) -> Callable[..., None] | None:
    """A ``(done, total, note="")`` callback drawing a rich progress bar on stderr, or None when
    not ``enabled`` (stderr not a terminal: tests and pipes stay clean).  ``note`` is shown after
    the bar (what is running now).  The bar starts at the first call (after any worker process is
    forked: no thread is forked with it) and stops when ``done == total``; call ``stop`` on the
    returned function to stop it early, and ``say(text)`` to print a line that stays above the
    bar (a finished part)."""
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True, highlight=False)
    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        TextColumn("{task.description}"), console=console, transient=True)
    task: list[Any] = []

    def update(done: int, total: int, note: str = "") -> None:
        if not task:
            progress.start()
            task.append(progress.add_task(note, total=total))
        progress.update(task[0], completed=done, total=total, description=note)
        if done >= total:
            progress.stop()

    def say(text: str) -> None:
        (progress.console if task else console).print(text, markup=False)

    update.stop = progress.stop  # type: ignore[attr-defined]
    update.say = say  # type: ignore[attr-defined]
    return update
