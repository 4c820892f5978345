"""What `towerbench ui` shows of the servers it runs: all of their output goes to log files, the
terminal gets what a person needs (errors, each warning once, and optionally the rest)."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import IO, TextIO

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_CHAINED = ("The above exception", "During handling of the above")  # between two tracebacks
# Inside a traceback: frames and code are indented; rich draws a box.
_TRACEBACK_BODY = ("│", "╰", "╭", *_CHAINED)
_WARNING = re.compile(r"\bWARN(ING)?\b|Warning\b|^[IWE]\d{4} ")  # absl's I0000-style lines too
_PYTHON_WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ")  # followed by an indented code line
# A library's deprecation notice is for its developers: the log file only.
_LIBRARY_DEPRECATION = re.compile(r"site-packages/\S+\.py:\d+: \w*DeprecationWarning: ")
_ERROR = re.compile(r"\b(ERROR|CRITICAL)\b")
# Start-up chatter that says nothing to a user.
_NOISE = ("All log messages before absl::InitializeLog() is called",)


class TerminalFilter:
    """Decides, line by line, what of one process's output reaches the terminal.

    Errors always do; a traceback as its last line (the exception) and where the full one is;
    a warning only the first time any process says it (numbers aside: timestamps, pids); with
    `everything`, all other lines too.
    """

    def __init__(self, log_path: Path, everything: bool, seen_warnings: set[str]):
        self.log_path = log_path
        self.everything = everything
        self.seen_warnings = seen_warnings
        self.in_traceback = False
        self.after_python_warning = False

    def __call__(self, line: str) -> str | None:
        text = line.rstrip()
        if self.in_traceback:
            if not text or text[0].isspace() or text.startswith(_TRACEBACK_BODY):
                return None
            if _TRACEBACK.search(text):
                return None
            self.in_traceback = False
            return f"{text}  (traceback in {self.log_path})"
        if self.after_python_warning and line[:1].isspace():
            return None  # the code line Python prints under a warning
        self.after_python_warning = bool(_PYTHON_WARNING.search(text))
        if _TRACEBACK.search(text):
            self.in_traceback = True
            return None
        if text.startswith(_CHAINED):
            return None
        if not text or _LIBRARY_DEPRECATION.search(text) or any(n in text for n in _NOISE):
            return None
        if _WARNING.search(text):
            key = re.sub(r"\d+", "#", text)
            if key in self.seen_warnings:
                return None
            self.seen_warnings.add(key)
            return text
        return text if self.everything or _ERROR.search(text) else None


class OutputRelay:
    """Copies child processes' output to `<log_dir>/<name>.log`, and through a TerminalFilter to
    the terminal; warnings count as seen across all the processes it follows."""

    def __init__(self, log_dir: Path, terminal: TextIO = sys.stdout):
        self.log_dir = log_dir
        self.terminal = terminal
        self._seen_warnings: set[str] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def follow(self, name: str, stream: IO[str], everything: bool = False) -> None:
        """Relay `stream` (a child's output pipe) until it closes, in a background thread."""
        log_path = self.log_dir / f"{name}.log"
        terminal_filter = TerminalFilter(log_path, everything, self._seen_warnings)
        thread = threading.Thread(
            target=self._copy, args=(stream, log_path, terminal_filter), daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def say(self, line: str) -> None:
        """A line of our own, never interleaved with a relayed one."""
        with self._lock:
            print(line, file=self.terminal, flush=True)

    def finish(self, timeout_seconds: float = 5) -> None:
        """Wait for the relayed streams to end (their processes have exited)."""
        for thread in self._threads:
            thread.join(timeout_seconds)

    def _copy(self, stream: IO[str], log_path: Path, terminal_filter: TerminalFilter) -> None:
        with open(log_path, "a") as log:
            for line in stream:
                log.write(line)
                log.flush()
                with self._lock:
                    shown = terminal_filter(line)
                    if shown is not None:
                        print(shown, file=self.terminal, flush=True)
