"""Fetch one file from an HTTP(S) URL, a file:// URL or a local path, verified by md5.

HTTP downloads stream into `<dest>.part` with a progress bar on stderr. A dropped connection or
a server error is retried with exponential backoff, and every retry (or the next `fetch`)
resumes from the bytes already on disk with an HTTP Range request. The md5 is checked before
`<dest>` appears; a mismatching file is deleted so it is never resumed or used. Only a dropped
connection (or an interrupt) keeps `<dest>.part`, for the next fetch to resume; any other
failure, a full disk included, deletes it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
from tqdm import tqdm

from towerbench.core.errors import TowerbenchError
from towerbench.core.files import space_errors

_CHUNK = 1 << 20
_TIMEOUT_SECONDS = 30.0


class _RetryableError(Exception):
    """A failure worth another attempt (connection trouble, 5xx)."""


class DownloadInterrupted(TowerbenchError):
    """The connection kept failing; the partial file stays for the next fetch to resume."""


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def local_path(url: str) -> Path | None:
    """The filesystem path `url` names (a plain path or file:// URL), or None for HTTP(S)."""
    parsed = urlparse(url)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise TowerbenchError(f"--url {url}: unsupported scheme {parsed.scheme!r}")
    return Path(url).expanduser()


def _stream_once(url: str, part: Path) -> None:
    """One attempt: append to `part` from where it ends (Range), or start over on a 200."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        with httpx.stream(
            "GET", url, headers=headers, timeout=_TIMEOUT_SECONDS, follow_redirects=True
        ) as response:
            if response.status_code == 416 and offset:
                return  # Nothing left to send: the partial file is already whole.
            if response.status_code >= 500:
                raise _RetryableError(f"HTTP {response.status_code}")
            if response.status_code not in (200, 206):
                raise TowerbenchError(
                    f"{url}: HTTP {response.status_code} {response.reason_phrase}; nothing "
                    "downloaded (a wrong URL: not retried)"
                )
            if response.status_code == 200:
                offset = 0  # The server ignored Range: start over.
            elif not response.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
                part.unlink()  # A range we did not ask for: the partial file is unusable.
                raise _RetryableError("server answered with the wrong byte range")
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length is not None else None
            with (
                space_errors(part, total, "the download"),
                open(part, "ab" if offset else "wb") as out,
                tqdm(
                    total=total,
                    initial=offset,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=part.name.removesuffix(".part"),
                    file=sys.stderr,
                    disable=None,
                ) as progress,
            ):
                for chunk in response.iter_bytes():  # as received: a drop loses nothing
                    out.write(chunk)
                    progress.update(len(chunk))
    except httpx.TransportError as error:
        unknown = _name_lookup_failure(error)
        if unknown is not None:
            raise TowerbenchError(
                f"{url}: host {urlparse(url).hostname!r} not found ({unknown.strerror}): no "
                "network, or a wrong URL; nothing downloaded (not retried)"
            ) from None
        raise _RetryableError(str(error) or type(error).__name__) from None


def _name_lookup_failure(error: BaseException) -> socket.gaierror | None:
    """The DNS failure behind a connection error, if that was the cause: a wrong host name, or
    no network at all; waiting and retrying changes neither within a fetch."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _download(url: str, part: Path, retries: int, backoff_seconds: float) -> None:
    for attempt in range(retries + 1):
        try:
            _stream_once(url, part)
            return
        except _RetryableError as error:
            if attempt == retries:
                have = part.stat().st_size if part.exists() else 0
                if not have:
                    part.unlink(missing_ok=True)  # nothing to resume: leave no empty file
                kept = f"{have} bytes kept in {part.resolve()}, " if have else "nothing kept; "
                raise DownloadInterrupted(
                    f"{url}: download failed after {attempt + 1} attempt(s) ({error}); "
                    f"{kept}run fetch again to resume"
                ) from None
            time.sleep(backoff_seconds * 2**attempt)


def fetch_file(
    url: str,
    dest: Path,
    md5: str | None,
    retries: int,
    check: Callable[[Path], None] | None = None,
    backoff_seconds: float = 1.0,
) -> str:
    """Place the file at `url` at `dest` once its md5 matches `md5` (if given) and `check(path)`
    accepts it; return its md5. A rejected file is deleted."""
    part = dest.with_name(dest.name + ".part")
    source = local_path(url)
    try:
        if source is not None:
            if not source.is_file():
                raise TowerbenchError(f"--url {url}: no such file")
            with space_errors(part, source.stat().st_size, "the copy"):
                shutil.copyfile(source, part)
        else:
            _download(url, part, retries, backoff_seconds)
    except (DownloadInterrupted, KeyboardInterrupt):
        if source is not None:  # a copy has nothing to resume
            part.unlink(missing_ok=True)
        raise
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    actual = file_md5(part)
    if md5 is not None and actual != md5.lower():
        part.unlink()
        raise TowerbenchError(
            f"{url}: md5 is {actual}, expected {md5.lower()}; download deleted, nothing published"
        )
    if check is not None:
        try:
            check(part)
        except TowerbenchError as error:
            part.unlink()
            # Name what the user gave, not our temporary file.
            raise TowerbenchError(str(error).replace(str(part), url)) from None
        except BaseException:
            part.unlink()
            raise
    os.replace(part, dest)
    return actual
