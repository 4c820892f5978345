"""Read archives without trusting them.

Every member is checked as if it were about to be extracted into a target folder: absolute
paths, `..` components, links, devices and FIFOs are refused with the archive and member named.
The checked members are then read straight into memory, so nothing is written outside, or
half-written inside, the data dir.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from towerbench.core.errors import TowerbenchError


def _check_member_path(archive: Path, name: str) -> None:
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")) or ".." in path.parts:
        raise TowerbenchError(f"{archive}: member {name!r} escapes the extraction folder")


def read_tar(archive: Path, wanted: set[str]) -> dict[str, bytes]:
    """Check every member of a (gzipped) tar, return {basename: bytes} for the `wanted` basenames.

    A truncated or corrupt archive, a duplicate wanted name or a missing one is a TowerbenchError.
    """
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                _check_member_path(archive, member.name)
                if member.issym() or member.islnk():
                    raise TowerbenchError(f"{archive}: member {member.name!r} is a link, refused")
                if not (member.isfile() or member.isdir()):
                    raise TowerbenchError(
                        f"{archive}: member {member.name!r} is a device or FIFO, refused"
                    )
                base = PurePosixPath(member.name).name
                if member.isfile() and base in wanted:
                    if base in found:
                        raise TowerbenchError(f"{archive}: more than one member named {base!r}")
                    handle = tar.extractfile(member)
                    found[base] = handle.read() if handle is not None else b""
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise TowerbenchError(
            f"{archive}: truncated or corrupt archive ({error or type(error).__name__})"
        ) from None
    missing = sorted(wanted - set(found))
    if missing:
        raise TowerbenchError(f"{archive}: missing member(s) {', '.join(missing)}")
    return found


def check_zip(archive: Path) -> None:
    """Refuse a zip that is not readable or has members that escape, or are links."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            for info in zipped.infolist():
                _check_member_path(archive, info.filename)
                if stat.S_ISLNK(info.external_attr >> 16):
                    raise TowerbenchError(f"{archive}: member {info.filename!r} is a link, refused")
            bad = zipped.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as error:
        raise TowerbenchError(f"{archive}: truncated or corrupt zip ({error})") from None
    if bad is not None:
        raise TowerbenchError(f"{archive}: member {bad!r} is corrupt (CRC mismatch)")
