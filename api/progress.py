"""A progress bar per configuration in Jupyter; in a script, Prefect's log lines on stderr (one
per epoch and configuration) are the progress, as on the command line."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from towerbench.tasks.training.progress import listening


def _in_jupyter() -> bool:
    return "ipykernel" in sys.modules


@contextlib.contextmanager
def progress_bars() -> Iterator[None]:
    """While the block runs, each configuration's epochs as a bar (Jupyter only)."""
    if not _in_jupyter():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without ipywidgets: a text bar, and a warning saying so
        from tqdm.auto import tqdm
    bars: dict[str, Any] = {}

    def show(name: str, done: float, planned: float) -> None:
        if name not in bars:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                bars[name] = tqdm(total=planned, desc=name, unit="epoch", file=sys.stderr)
        bar = bars[name]
        bar.total = max(bar.total, done)  # AdaScale may train past its planned epochs
        bar.n = round(done, 2)
        bar.refresh()

    try:
        with listening(show):
            yield
    finally:
        for bar in bars.values():
            bar.close()
