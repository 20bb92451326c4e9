"""The one way to read a file a user hands us: regular files only, bounded, never a traceback.

A path on the command line may be a FIFO (open() blocks until a writer comes), a device (/dev/zero
never ends), a socket, a directory, unreadable, or simply huge. `read_user_bytes` judges the file type
with stat() before opening, opens without blocking, reads at most `limit` bytes and raises
`InputRefused` (an OSError, so callers' `except OSError` and `exc.strerror` keep working) with a plain
reason. `load_json_text` and `load_toml_text` turn deep nesting into a ValueError instead of a
RecursionError, and `write_new_file` never overwrites without being told to, nor writes through a
symbolic link.

Size caps (documented in docs/limits.md): see the *_LIMIT constants below.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO, Optional, Union

MiB = 1024 * 1024
# Tool output handed to `parse`, and each <command>.txt of a snapshot: the largest real ones (dmesg of a
# busy node, nvidia-smi -q of 8 GPUs) are a few MiB.
TOOL_OUTPUT_LIMIT = 64 * MiB
# Each <fact>.json of a snapshot, a --baseline JSON, a cluster report: real ones are well under 1 MiB.
JSON_FILE_LIMIT = 16 * MiB
# An expectations TOML (`--expect`): a few dozen lines.
TOML_FILE_LIMIT = 1 * MiB
# A Python file given to `lint` (the largest files in real projects are a few hundred KiB).
SOURCE_FILE_LIMIT = 8 * MiB
# A .gitignore consulted by `lint`.
GITIGNORE_LIMIT = 1 * MiB
# JSON or TOML nested deeper than this is not a file ddpdoctor wrote or documents (ours nest < 10).
MAX_NESTING = 64

Pathish = Union[str, "os.PathLike[str]"]


class InputRefused(OSError):
    """A user file we will not read (special file, too large) or write (exists, symbolic link).

    An OSError with `strerror` set to a plain reason, so existing `except OSError` handlers report it."""

    def __init__(self, code: int, reason: str, path: Optional[Pathish] = None) -> None:
        super().__init__(code, reason, None if path is None else str(path))


def describe_file_type(mode: int) -> str:
    """'directory', 'FIFO', 'character device', ... for an st_mode."""
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symbolic link"),
    ):
        if test(mode):
            return name
    return "special file"


def format_size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


def _refuse_special(mode: int, path: Pathish) -> None:
    if not stat.S_ISREG(mode):
        raise InputRefused(errno.EINVAL, f"not a regular file ({describe_file_type(mode)})", path)


def _too_large(limit: int, path: Optional[Pathish]) -> InputRefused:
    return InputRefused(
        errno.EFBIG, f"too large (more than {format_size(limit)}, the limit for this input)", path
    )


def _read_capped(read: Any, limit: int, path: Optional[Pathish]) -> bytes:
    """Read until EOF, at most `limit` bytes; one byte more means too large."""
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = read(min(1 * MiB, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise _too_large(limit, path)
    return b"".join(chunks)


def read_user_bytes(path: Pathish, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes.

    Raises FileNotFoundError / PermissionError / other OSError as open() does, and InputRefused for a
    FIFO, device, socket or directory (judged before opening, so nothing blocks) or a file over `limit`
    (judged from its size, then while reading: /proc files report size 0)."""
    st = os.stat(path)  # follows symbolic links: a link to /dev/zero is judged as /dev/zero
    _refuse_special(st.st_mode, path)
    if st.st_size > limit:
        raise _too_large(limit, path)
    return _read_regular(path, lambda read: _read_capped(read, limit, path))


def read_user_head(path: Pathish, limit: int) -> bytes:
    """The first `limit` bytes of a regular file, like `head -c`: a longer file is cut, not refused.

    For files read for a few settings (nccl.conf) rather than parsed whole. Raises as read_user_bytes."""
    _refuse_special(os.stat(path).st_mode, path)
    return _read_regular(path, lambda read: read(limit))


def _read_regular(path: Pathish, read_with: Any) -> bytes:
    # O_NONBLOCK: if the path was swapped for a FIFO since stat(), open() still returns at once.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _refuse_special(os.fstat(fd).st_mode, path)
        return read_with(lambda n: os.read(fd, n))
    finally:
        os.close(fd)


def read_user_text(path: Pathish, limit: int) -> str:
    """read_user_bytes decoded as UTF-8, undecodable bytes replaced (never a UnicodeDecodeError)."""
    return read_user_bytes(path, limit).decode("utf-8", errors="replace")


def read_stdin_bytes(limit: int, stream: Optional[BinaryIO] = None) -> bytes:
    """At most `limit` bytes of standard input; InputRefused when it is closed or longer."""
    if stream is None:
        stdin = sys.stdin
        stream = getattr(stdin, "buffer", None) if stdin is not None else None
    if stream is None:
        raise InputRefused(errno.EBADF, "standard input is closed")
    try:
        return _read_capped(stream.read, limit, "<stdin>")
    except ValueError as exc:  # read on a closed file
        raise InputRefused(errno.EBADF, "standard input is closed") from exc


def check_nesting(value: Any, limit: int = MAX_NESTING) -> None:
    """ValueError when lists/dicts nest deeper than `limit` (iterative: the check itself cannot recurse)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            raise ValueError(f"nested more than {limit} levels deep")
        stack.extend((c, depth + 1) for c in children)


def load_json_text(text: Union[str, bytes]) -> Any:
    """json.loads, with nesting past MAX_NESTING a ValueError (never a RecursionError).

    Raises ValueError (json.JSONDecodeError included) for anything that is not acceptable JSON."""
    import json

    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_NESTING} levels deep") from None
    check_nesting(value)
    return value


def load_toml_text(text: str) -> Any:
    """tomllib.loads, with deep nesting a ValueError; TOMLDecodeError is a ValueError too."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]

    try:
        value = tomllib.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_NESTING} levels deep") from None
    check_nesting(value)
    return value


def load_json_file(path: Pathish, limit: int = JSON_FILE_LIMIT) -> Any:
    """A bounded, regular JSON file. OSError (InputRefused included) for reading, ValueError for content."""
    return load_json_text(read_user_bytes(path, limit))


def write_new_file(path: Path, text: str, *, force: bool = False) -> None:
    """Write `text` to `path`, refusing (InputRefused) to replace an existing file unless `force`, and
    never writing through a symbolic link or into a FIFO/device, even with `force`.

    O_EXCL (new file) or O_NOFOLLOW (with force) make the refusal part of open() itself, so nothing can
    swap a link in between a check and the write."""
    try:
        st: Optional[os.stat_result] = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise InputRefused(errno.ELOOP, "is a symbolic link; refusing to write through it", path)
        if not force:
            raise InputRefused(errno.EEXIST, "exists (use --force to overwrite)", path)
        _refuse_special(st.st_mode, path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_TRUNC if force else os.O_EXCL
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise InputRefused(errno.EEXIST, "exists (use --force to overwrite)", path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputRefused(
                errno.ELOOP, "is a symbolic link; refusing to write through it", path
            ) from None
        raise
    try:
        _refuse_special(os.fstat(fd).st_mode, path)
        os.set_blocking(fd, True)
        data = text.encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


# Source files quoted by `hang` and `explain DIR` (the line a rank is stuck on): a training script.
SOURCE_QUOTE_LIMIT = 4 * MiB
# Never quoted, whatever a frame names and wherever the job runs: the kernel's and the system's files
# (/proc/self/environ would print the reader's own environment, /proc/kmsg blocks and eats messages).
FORBIDDEN_SOURCE_DIRS = ("/proc", "/sys", "/dev", "/etc", "/run", "/boot", "/root/.ssh")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def source_roots(candidates: list[str]) -> list[str]:
    """The directories a quoted source may lie in, resolved; `/` itself and system directories dropped
    (a job whose cwd is `/` does not make every file on the machine its source tree)."""
    roots = []
    for candidate in candidates:
        if not candidate:
            continue
        try:
            root = os.path.realpath(candidate)
        except (OSError, ValueError):
            continue
        if root == "/" or any(_inside(root, bad) for bad in FORBIDDEN_SOURCE_DIRS):
            continue
        if root not in roots:
            roots.append(root)
    return roots


def read_quoted_source(
    filename: str,
    roots: list[str],
    owner_uid: Optional[int] = None,
    limit: int = SOURCE_QUOTE_LIMIT,
) -> Optional[str]:
    """The redacted text of a source file a stack frame or dump names, or None when it must not be quoted.

    A frame's file name is chosen by the job (`exec(compile(src, "/etc/shadow", "exec"))`) or by whoever
    wrote the dump, so it is quoted only when all hold: it resolves (symbolic links followed) inside one
    of `roots` (source_roots: the job's own tree) and outside FORBIDDEN_SOURCE_DIRS; it is a regular file
    (judged on the opened descriptor, opened without blocking, so a FIFO or device can never block);
    when `owner_uid` is given (the rank's uid, the dump's owner) it is owned by that uid or readable by
    everyone, so `hang` run as root never prints a file the job itself could not read. At most `limit`
    bytes are read; the text is redacted (edge/redact.py) before it leaves this function."""
    from ddpdoctor.edge.redact import redact_text

    if not filename or filename.startswith("<") or "\0" in filename:
        return None
    try:
        real = os.path.realpath(filename)
    except (OSError, ValueError):
        return None
    if any(_inside(real, bad) for bad in FORBIDDEN_SOURCE_DIRS):
        return None
    if not any(_inside(real, root) for root in roots):
        return None
    try:
        # O_NOFOLLOW: the resolved name's last part cannot have been swapped for a link since realpath().
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        if owner_uid is not None and st.st_uid != owner_uid and not st.st_mode & stat.S_IROTH:
            return None
        data = _read_capped(lambda n: os.read(fd, n), limit, real)
    except OSError:
        return None
    finally:
        os.close(fd)
    return redact_text(data.decode("utf-8", errors="replace"))
