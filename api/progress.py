"""What a call from Python shows while it runs, on stdout as Keras' `model.fit` shows its own: a
bar per configuration (in Jupyter, tqdm's notebook bar, updated in place; on a terminal, a text
bar; piped to a file, none) and a line as each configuration ends. Unless `verbose=True`, nothing
else of Prefect's and MLflow's below a warning: their per-epoch and start-up lines stay in the
Prefect UI."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from towerbench.tasks.training.progress import listening

# The loggers whose lines a quiet call keeps off the console, unless a warning or worse.
THIRD_PARTY = ("prefect", "mlflow", "alembic", "httpx", "uvicorn", "docket")


def _in_jupyter() -> bool:
    return "ipykernel" in sys.modules


class _Shown:
    """The listener of the configurations' progress (tasks/training/progress.py)."""

    def __init__(self, lines: bool) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tqdm.auto without ipywidgets warns (a text bar)
            from tqdm.auto import tqdm
        self.tqdm = tqdm
        self.lines = lines
        self.bars: dict[str, Any] = {}
        self.drawn = _in_jupyter() or sys.stdout.isatty()

    def epoch(self, name: str, done: float, planned: float) -> None:
        if not self.drawn:
            return
        if name not in self.bars:
            self.bars[name] = self.tqdm(total=planned, desc=name, unit="epoch", file=sys.stdout)
        bar = self.bars[name]
        bar.total = max(bar.total, done)  # AdaScale may train past its planned epochs
        bar.n = round(done, 2)
        bar.refresh()

    def finished(self, line: str) -> None:
        if not self.lines:  # Prefect's own log line says it
            return
        self.tqdm.write(line, file=sys.stdout)  # above a terminal's bars, not through them

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


class _WarningsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith(THIRD_PARTY)


@contextlib.contextmanager
def _third_party_quiet() -> Iterator[None]:
    """Prefect's and MLflow's lines below a warning kept off the console (not off the API)."""
    import mlflow  # noqa: F401 - their logging set up before it is quieted
    import prefect  # noqa: F401

    console = [
        handler
        for name in ("", *THIRD_PARTY)
        for handler in logging.getLogger(name).handlers
        if isinstance(handler, logging.StreamHandler)
    ]
    quiet = _WarningsOnly()
    for handler in console:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in console:
            handler.removeFilter(quiet)


@contextlib.contextmanager
def shown_while_running(verbose: bool) -> Iterator[None]:
    """While the block runs, the configurations' bars and lines; quiet unless `verbose`."""
    shown = _Shown(lines=not verbose)
    try:
        with listening(shown), contextlib.ExitStack() as stack:
            if not verbose:
                stack.enter_context(_third_party_quiet())
            yield
    finally:
        shown.close()
