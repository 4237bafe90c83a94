"""Reading, on the host, a file that sandboxed code could have replaced: never through a link.

After a command ran in the sandbox, every path under its worktree is the sandboxed code's to change: a test
can swap its own pytest report for a symbolic link to a host file (the host would read that file into the
verdict), make `.lanes/` itself a link to a host folder, leave a FIFO (the host's read would block for
ever) or a file of gigabytes. So a result is read by walking its path one folder at a time from the
worktree, each opened with `O_NOFOLLOW` relative to the one before (a link anywhere on the path is
refused, not only in its last part), the file opened with `O_NONBLOCK` and taken only when `fstat` says it
is a regular file no larger than the limit. A file the host writes there after a run (a mutant, a body, the
module restored) is written the same way: never through a link on its path, and into a new file in place
of whatever the code left at its name (a link to a host file, a FIFO a write would block on).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath

from lanes_pipeline.errors import LaneError

MAX_RESULT_BYTES = 64 * 2**20


class UnsafeResultError(LaneError):
    """A result file in a sandbox's worktree that is not a plain file the host may read: names the path
    and why (its content is never read)."""


def _refused(relative: str, why: str) -> UnsafeResultError:
    return UnsafeResultError(f"{relative}: {why}; the sandboxed code may have replaced it, so it is not used")


FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(relative: str) -> tuple[str, ...]:
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or ".." in parts:
        raise _refused(relative, "not a path inside the worktree")
    return parts


def _close(opened: list[int]) -> None:
    for descriptor in reversed(opened):
        os.close(descriptor)


def _open_folders(root: Path, relative: str, make: bool = False) -> tuple[list[int], str] | None:
    """The open folders from `root` down to the parent of `relative` (each without following a link),
    and its last part; None when a folder on the way does not exist (`make`: it is created)."""
    parts = _parts(relative)
    opened = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    for part in parts[:-1]:
        try:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=opened[-1])
            opened.append(os.open(part, FOLDER_FLAGS, dir_fd=opened[-1]))
        except OSError as exc:
            _close(opened)
            if isinstance(exc, FileNotFoundError):
                return None
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refused(relative, f"{part} is a link or not a folder") from None
            raise
    return opened, parts[-1]


def remove_result(root: Path, relative: str) -> None:
    """Remove `relative` under `root` (whatever it is: a link is removed, not followed) before a run that
    writes it; a folder on the way that is a link is refused, as for reading."""
    found = _open_folders(root, relative)
    if found is None:
        return
    opened, name = found
    try:
        os.unlink(name, dir_fd=opened[-1])
    except FileNotFoundError:
        pass
    finally:
        _close(opened)


def read_result(root: Path, relative: str, max_bytes: int = MAX_RESULT_BYTES) -> bytes | None:
    """The bytes of `relative` under `root`, or None when it does not exist; UnsafeResultError when any
    part of the path is a link, the file is not a regular file, or it holds more than `max_bytes`."""
    found = _open_folders(root, relative)
    if found is None:
        return None
    opened, name = found
    try:
        file_flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            handle = os.open(name, file_flags, dir_fd=opened[-1])
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused(relative, "a symbolic link") from None
            raise
        opened.append(handle)
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode):
            raise _refused(relative, "not a regular file")
        if status.st_size > max_bytes:
            raise _refused(relative, f"{status.st_size} bytes, more than {max_bytes}")
        with os.fdopen(os.dup(handle), "rb") as stream:
            data = stream.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise _refused(relative, f"more than {max_bytes} bytes")
        return data
    finally:
        _close(opened)


def read_result_text(root: Path, relative: str, max_bytes: int = MAX_RESULT_BYTES) -> str | None:
    """`read_result` decoded as UTF-8 (undecodable bytes replaced: a result is parsed, never run)."""
    data = read_result(root, relative, max_bytes)
    return None if data is None else data.decode("utf-8", "replace")


def write_result(root: Path, relative: str, data: bytes, owner: int | None = None) -> None:
    """Write `data` as a new regular file at `relative` under `root` (missing folders made; `owner`: the
    file's uid and gid). Whatever sits at its name is removed first, not opened (a link is never followed,
    a FIFO never blocks the write); a regular file's permissions are kept. UnsafeResultError when a folder
    on the way is a link or not a folder, or the name is a folder."""
    found = _open_folders(root, relative, make=True)
    assert found is not None  # every missing folder was made
    opened, name = found
    try:
        mode = 0o644
        with contextlib.suppress(FileNotFoundError):
            status = os.stat(name, dir_fd=opened[-1], follow_symlinks=False)
            if stat.S_ISDIR(status.st_mode):
                raise _refused(relative, "a folder")
            if stat.S_ISREG(status.st_mode):
                mode = stat.S_IMODE(status.st_mode) & 0o777
            os.unlink(name, dir_fd=opened[-1])
        file_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        opened.append(os.open(name, file_flags, mode, dir_fd=opened[-1]))
        if owner is not None:
            os.fchown(opened[-1], owner, owner)
        view = memoryview(data)
        while view:
            view = view[os.write(opened[-1], view) :]
    finally:
        _close(opened)
