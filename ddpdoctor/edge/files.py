"""The one way to read a file a user hands us: regular files only, bounded, never a traceback.

A path on the command line may be a FIFO (open() blocks until a writer comes), a device (/dev/zero
never ends), a socket, a directory, unreadable, or simply huge. `read_user_bytes` judges the file type
with stat() before opening, opens without blocking, reads at most `limit` bytes and raises
`InputRefused` (an OSError, so callers' `except OSError` and `exc.strerror` keep working) with a plain
reason. `load_json_text` and `load_toml_text` turn deep nesting into a ValueError instead of a
RecursionError, and `write_output_file` never overwrites without being told to, nor writes through a
symbolic link.

Size caps (documented in docs/limits.md): see the *_LIMIT constants below.
Over 600 lines: the one bounded reader and writer of user files; every file type and size guard is here so no other module opens a user's path.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
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
    return _read_regular(path, lambda read, _: _read_capped(read, limit, path))


def read_user_head(path: Pathish, limit: int) -> bytes:
    """The first `limit` bytes of a regular file, like `head -c`: a longer file is cut, not refused.

    For files read for a few settings (nccl.conf) rather than parsed whole. Raises as read_user_bytes."""
    _refuse_special(os.stat(path).st_mode, path)
    return _read_regular(path, lambda read, _: read(limit))


def _open_regular(path: Pathish, extra_flags: int = 0) -> int:
    """A descriptor on a regular file, or InputRefused/OSError. O_NONBLOCK: if the path was swapped for
    a FIFO since any stat(), open() still returns at once, and fstat() on the descriptor then refuses it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | extra_flags)
    try:
        _refuse_special(os.fstat(fd).st_mode, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_regular(path: Pathish, read_with: Any, extra_flags: int = 0) -> bytes:
    fd = _open_regular(path, extra_flags)
    try:
        return read_with(lambda n: os.read(fd, n), os.fstat(fd))
    finally:
        os.close(fd)


def shown_path(path: Pathish, width: int = 160) -> str:
    """`path` for a one-line message: a 5000-character name is cut in the middle, not printed whole."""
    text = os.fspath(path)
    return text if len(text) <= width else f"{text[: width // 2]}...{text[-width // 2 :]} ({len(text)} characters)"


def user_path_mode(path: Pathish, *, follow_symlinks: bool = True) -> Optional[int]:
    """The st_mode of a path the user named, or None when nothing is there (ENOENT, ENOTDIR).

    The one check of a user's path before deciding what it is (pathlib's exists()/is_dir() raise for a
    name too long, a loop of links, a directory that cannot be searched, and `\\0` raises ValueError):
    any such failure is an InputRefused with a one-line reason, which each command reports as a usage
    error (exit 2), with refusal_text (the path shortened)."""
    try:
        return os.stat(path, follow_symlinks=follow_symlinks).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:
        raise InputRefused(errno.EINVAL, "not a usable path (it holds a NUL byte)", path) from None
    except OSError as exc:
        raise InputRefused(exc.errno or errno.EINVAL, f"cannot use this path: {exc.strerror or exc}", path) from None


def is_regular_file(path: Pathish) -> bool:
    """Whether a user's path names a regular file (following links); False for anything user_path_mode
    refuses (too long, a loop of links, unsearchable), so a directory listing can simply skip it."""
    try:
        mode = user_path_mode(path)
    except InputRefused:
        return False
    return mode is not None and stat.S_ISREG(mode)


def refusal_text(exc: OSError) -> str:
    """'PATH: reason' on one line, for an OSError (InputRefused included) about a user's path."""
    reason = exc.strerror or str(exc)
    return f"{shown_path(exc.filename)}: {reason}" if exc.filename else reason


def snapshot_entry_present(directory: Pathish, name: str) -> bool:
    """Whether `name` is anything at all in `directory`, a symbolic link or special file included (those
    are then refused by read_snapshot_bytes, with a finding, rather than taken for absent)."""
    try:
        os.lstat(os.path.join(directory, name))
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return True


def read_snapshot_bytes(directory: Pathish, name: str, limit: int) -> bytes:
    """The bytes of file `name` directly inside snapshot `directory`: a regular file, not a symbolic
    link, at most `limit` bytes.

    A snapshot comes from someone else (a colleague's tarball): a `df-shm.txt` that is a link to
    /etc/shadow would otherwise be printed as evidence. The name is opened relative to the directory's
    own descriptor with O_NOFOLLOW, so no link (nor a `..` or `/` in the name) can lead outside it, and
    no check-then-open race can either. Raises InputRefused (an OSError) for a link, a special file or
    a file over `limit`; FileNotFoundError when absent."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise InputRefused(errno.EINVAL, "not a plain file name inside the snapshot", name)
    dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        path = os.path.join(directory, name)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputRefused(
                    errno.ELOOP, "a symbolic link; snapshot files must be regular files inside the snapshot", path
                ) from None
            raise
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        _refuse_special(st.st_mode, path)
        if st.st_size > limit:
            raise _too_large(limit, path)
        return _read_capped(lambda n: os.read(fd, n), limit, path)
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


# The temporary file's name keeps at most this much of the target's (in characters, 4 bytes each at
# most): `.NAME.XXXXXXXX.tmp` must fit in 255 bytes when NAME itself does (a 250-byte -o name).
_TMP_NAME_KEEP = 50


def _planted_link(directory: str) -> Optional[str]:
    """The first directory on the way to `directory` that is a symbolic link lying in a world-writable
    directory (/tmp, /dev/shm), or None. Anyone could have planted such a link (`/tmp/out -> /etc`), so
    writing through it is refused, as the kernel's protected_symlinks would for a file; a link only its
    owner or root could make (~/results -> /scratch, /var/run -> /run) is followed."""
    current = "/" if directory.startswith("/") else ""
    for part in [p for p in directory.split("/") if p]:
        holder = current or "."
        current = os.path.join(current, part) if current else part
        try:
            st = os.lstat(current)
        except OSError:
            return None  # absent: the directory check that follows says so
        if stat.S_ISLNK(st.st_mode):
            try:
                writable_by_all = bool(os.stat(holder).st_mode & stat.S_IWOTH)
            except OSError:
                writable_by_all = True
            if writable_by_all:
                return current
    return None


def output_target_problem(path: Pathish, *, force: Optional[bool] = False) -> Optional[str]:
    """Why an output file of ours cannot be written at `path` (None when it can): asked before a command
    runs anything, so that no probe or benchmark runs only to lose its output, and asked again by
    write_output_file.

    `force`: False (refuse an existing file: `report -o`, `expect --write`, `bench-nccl --json/--csv`),
    True (replace it: `--force`), None (always replaced: `-o FILE.prom`, which a collector re-reads).
    Refused whatever `force`: a name ending in '/' (that names a directory), a symbolic link, a
    directory, a FIFO or device, a symbolic link to a directory planted in a world-writable directory
    (_planted_link), a directory that is absent or not writable; and any name the system refuses
    (too long, NUL): a temporary file is really created there and removed again."""
    import tempfile

    text = os.fspath(path)
    if not text:
        return "an empty file name"
    if "\0" in text:
        return "not a usable path (it holds a NUL byte)"
    if text.endswith("/"):
        return "names a directory (it ends in '/'); give a file name"
    try:
        st: Optional[os.stat_result] = os.lstat(text)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot use this path: {exc.strerror or exc}"
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link; refusing to write through it"
        if stat.S_ISDIR(st.st_mode):
            return "is a directory; only a regular file is replaced"
        if not stat.S_ISREG(st.st_mode):
            return f"is not a regular file ({describe_file_type(st.st_mode)}); only a regular file is replaced"
        if force is False:
            return "exists (use --force to overwrite)"
    parent = os.path.dirname(text) or "."
    link = _planted_link(parent)
    if link is not None:
        return f"{shown_path(link)} is a symbolic link in a world-writable directory; refusing to write through it"
    try:
        parent_mode = os.stat(parent).st_mode
    except OSError:
        parent_mode = None
    if parent_mode is None or not stat.S_ISDIR(parent_mode):
        return f"its directory {shown_path(parent)!r} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {shown_path(parent)!r} is not writable (the new file is made there, then renamed)"
    try:
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(text), suffix=".tmp", dir=parent)
    except OSError as exc:
        return f"cannot create a file in its directory: {exc.strerror or exc}"
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return None


def _tmp_prefix(path: str) -> str:
    return f".{os.path.basename(path)[:_TMP_NAME_KEEP]}."


def write_output_file(path: Pathish, text: str, *, force: Optional[bool] = False, mode: int = 0o644) -> None:
    """The one writer of every output file of every command (`report -o`, `expect --write`, `-o`,
    `bench-nccl --json/--csv`): InputRefused (an OSError) for what output_target_problem refuses, else
    the text is written to a temporary file in the same directory, flushed, and renamed into place.

    Never in place: a file with a second (hard) link keeps its old content under that other name, a
    reader (node_exporter's textfile collector) sees the old file or the new one and never half of one,
    and a symbolic link swapped in meanwhile is replaced, not written through. Without `force` (False)
    the rename is a link(), which fails if the name appeared meanwhile. The temporary name starts with a
    dot and ends in .tmp, so a collector reading `*.prom` never picks it up."""
    import tempfile

    target = os.fspath(path)
    problem = output_target_problem(target, force=force)
    if problem is not None:
        code = errno.EEXIST if problem.startswith("exists") else errno.EINVAL
        raise InputRefused(code, problem, target)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=os.path.dirname(target) or ".")
    try:
        try:
            os.fchmod(fd, mode)  # mkstemp's 0600 would hide the file from a collector run as another user
            view = memoryview(text.encode("utf-8"))
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if force is False:
            try:
                os.link(tmp, target)  # fails with EEXIST: never replaces a file that appeared meanwhile
            except FileExistsError:
                raise InputRefused(errno.EEXIST, "exists (use --force to overwrite)", target) from None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                    raise
                # A file system without hard links (FAT, some network mounts): a last look, then rename.
                if os.path.lexists(target):
                    raise InputRefused(errno.EEXIST, "exists (use --force to overwrite)", target) from None
                os.replace(tmp, target)
        else:
            os.replace(tmp, target)
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_atomic(path: Pathish, text: str, mode: int = 0o644) -> None:
    """write_output_file for a file replaced on every run (`-o FILE.prom` for a textfile collector)."""
    write_output_file(path, text, force=None, mode=mode)


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
    when `owner_uid` is given (the rank's uid, the dump's owner) it is owned by that uid, so `hang` run
    as root never prints a file the job itself could not read. At most `limit`
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

    def read_owned(read: Any, st: os.stat_result) -> bytes:
        if st.st_size > limit:
            raise _too_large(limit, real)
        if owner_uid is not None and st.st_uid != owner_uid:
            # Not "or world-readable": a world-readable file in a directory the job cannot enter
            # (/root/x) is still not the job's; its own scripts are owned by its user.
            raise InputRefused(errno.EACCES, "not owned by the job's user", real)
        return _read_capped(read, limit, real)

    try:
        # O_NOFOLLOW: the resolved name's last part cannot have been swapped for a link since realpath().
        data = _read_regular(real, read_owned, os.O_NOFOLLOW)
    except (OSError, ValueError):
        return None
    return redact_text(data.decode("utf-8", errors="replace"))


# Logs handed to `explain`: the head read to tell the format, and the most read from standard input
# (a file is finite; a pipe such as `yes |` or `< /dev/zero` need not be).
LOG_SNIFF_BYTES = 8192
STDIN_LOG_LIMIT = 2 * 1024 * MiB
# Where no log lives: reading /proc/kmsg blocks and consumes the kernel's messages, /dev/* never ends.
KERNEL_DIRS = ("/proc", "/sys")
NOT_LOG_DIRS = (*KERNEL_DIRS, "/dev")


def in_kernel_dir(path: Pathish) -> bool:
    """Whether `path` resolves under /proc or /sys: kernel files, which a read can block on or consume
    (/proc/kmsg), never a user's data file (a dump directory named by a job's TORCH_FR_DUMP_TEMP_FILE)."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return True
    return any(_inside(real, d) for d in KERNEL_DIRS)
_GZIP, _XZ, _BZ2, _ZSTD = b"\x1f\x8b", b"\xfd7zXZ\x00", b"BZh", b"\x28\xb5\x2f\xfd"


class _Prefixed(io.RawIOBase):
    """`head` then the rest of `raw`; past `limit` bytes in all, reading raises InputRefused (an OSError:
    the log scanner keeps what it read and says it stopped early)."""

    def __init__(
        self, head: bytes, raw: BinaryIO, limit: Optional[int], name: str, pending: Optional[OSError] = None
    ) -> None:
        self._head, self._raw, self._limit, self._name, self._total = head, raw, limit, name, 0
        self._pending = pending

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
        else:
            if self._pending is not None:
                raise self._pending
            if self._limit is not None and self._total >= self._limit:
                raise InputRefused(errno.EFBIG, f"stopped after {format_size(self._limit)}", self._name)
            data = self._raw.read(len(buffer))
            n = len(data or b"")
            buffer[:n] = data or b""
        self._total += n
        return n


class _Utf16AsUtf8(io.RawIOBase):
    """A UTF-16 stream read as UTF-8 (the scanner reads bytes; Windows tools write UTF-16)."""

    def __init__(self, raw: BinaryIO, encoding: str) -> None:
        import codecs

        self._raw, self._decoder, self._out = raw, codecs.getincrementaldecoder(encoding)("replace"), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out:
            data = self._raw.read(64 * 1024)
            self._out = self._decoder.decode(data or b"", final=not data).encode("utf-8")
            if not data:
                break
        n = min(len(buffer), len(self._out))
        buffer[:n], self._out = self._out[:n], self._out[n:]
        return n


class _Owning(io.RawIOBase):
    """The decoded stream, closing every layer under it (GzipFile and LZMAFile leave their file object
    open), and with a decoder's own errors (LZMAError, a zstd error, EOFError of a cut archive) turned
    into OSError, which the log scanner reports as "read stopped early"."""

    def __init__(self, inner: Any, layers: list[Any]) -> None:
        self._inner, self._layers = inner, layers
        # read1: one read of the layer below, so what a cut archive yields before its end is not lost
        # with the EOFError (read(n) would gather n bytes first).
        self._read = getattr(inner, "read1", None) or inner.read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._read(len(buffer))
        except OSError:
            raise
        except Exception as exc:  # lzma.LZMAError, zlib.error, EOFError, zstd errors
            raise OSError(errno.EIO, f"{type(exc).__name__}: {exc}"[:200]) from None
        n = len(data or b"")
        buffer[:n] = data or b""
        return n

    def close(self) -> None:
        for layer in [self._inner, *self._layers]:
            try:
                layer.close()
            except Exception:  # noqa: S110 - closing what we opened; nothing to report
                pass
        super().close()


def _read_head(raw: BinaryIO, size: int) -> tuple[bytes, Optional[OSError]]:
    """Up to `size` bytes, and the error that stopped the reading early (a corrupt archive), if any:
    the error is raised again after the head is read, so what came before it is still scanned."""
    parts, total = [], 0
    while total < size:
        try:
            data = raw.read(size - total)
        except OSError as exc:
            return b"".join(parts), exc
        except Exception as exc:  # zlib.error, lzma.LZMAError, EOFError of a cut archive
            return b"".join(parts), OSError(errno.EIO, f"{type(exc).__name__}: {exc}"[:200])
        if not data:
            break
        parts.append(data)
        total += len(data)
    return b"".join(parts), None


def _utf16_encoding(head: bytes) -> Optional[str]:
    """'utf-16-le'/'-be' for a head of mostly ASCII text written as UTF-16 (every other byte NUL: what
    PowerShell's `>` writes), with or without a byte-order mark; else None. A mark alone is not enough:
    a UTF-8 log may start with those bytes as garbage."""
    bom = head[:2]
    sample = head[2:] if bom in (b"\xff\xfe", b"\xfe\xff") else head
    sample = sample[: len(sample) // 2 * 2][:4096]
    if len(sample) < 8:
        return None
    even, odd = sample[0::2], sample[1::2]
    share = 0.5 if bom in (b"\xff\xfe", b"\xfe\xff") else 0.9
    if odd.count(0) > share * len(odd) and even.count(0) < 0.1 * len(even):
        return "utf-16-le"
    if even.count(0) > share * len(even) and odd.count(0) < 0.1 * len(odd):
        return "utf-16-be"
    return None


def open_log_stream(raw: BinaryIO, name: str, limit: Optional[int] = None) -> BinaryIO:
    """A log as UTF-8-ish bytes, whatever it was written as: gzip, xz, bzip2 (by magic bytes, not name)
    and UTF-16 (a byte-order mark, or NUL every other byte) are decoded. InputRefused (exit 2 in
    `explain`) for zstd when no zstd module is installed, and for binary data (NUL bytes) that is no log
    (`explain < /dev/zero`). `limit` bounds the bytes read from `raw` (standard input). Closing the
    result closes `raw`."""
    layers: list[Any] = [raw]
    try:
        inner = _decode_log(raw, name, limit, layers, 0)
    except BaseException:
        for layer in layers:
            layer.close()
        raise
    return io.BufferedReader(_Owning(inner, [layer for layer in layers if layer is not inner]))  # type: ignore[arg-type,return-value]


def _decode_log(raw: Any, name: str, limit: Optional[int], layers: list[Any], depth: int) -> Any:
    head, pending = _read_head(raw, LOG_SNIFF_BYTES)
    stream: Any = io.BufferedReader(_Prefixed(head, raw, limit, name, pending))  # type: ignore[arg-type]
    layers.append(stream)
    decompressed: Optional[BinaryIO] = None
    if head.startswith(_GZIP):
        import gzip

        decompressed = gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[assignment]
    elif head.startswith(_XZ):
        import lzma

        decompressed = lzma.LZMAFile(stream)  # type: ignore[assignment]
    elif head.startswith(_BZ2) and head[3:4].isdigit():
        import bz2

        decompressed = bz2.BZ2File(stream)  # type: ignore[assignment]
    elif head.startswith(_ZSTD):
        decompressed = _open_zstd(stream, name)
    if decompressed is not None:
        layers.append(decompressed)
        if depth:
            raise InputRefused(errno.EINVAL, "compressed twice over; decompress it first", name)
        return _decode_log(decompressed, name, None, layers, depth + 1)
    encoding = _utf16_encoding(head)
    if encoding is not None:
        return _Utf16AsUtf8(stream, encoding)
    if _binary_share(head) > BINARY_SHARE_LIMIT:
        what = "only NUL bytes" if not head.strip(b"\0") else "binary data"
        raise InputRefused(errno.EINVAL, f"{what} (in its first {len(head)} bytes), not a text log", name)
    return stream


# A head with more than this share of NULs, control characters and invalid UTF-8 is no log (`/dev/zero`,
# a core file): a few garbage bytes or a NUL hole in a real log stay far below it.
BINARY_SHARE_LIMIT = 0.3
_TEXT_CONTROLS = frozenset("\t\n\r\f\b\x1b")


def _binary_share(head: bytes) -> float:
    if not head:
        return 0.0
    text = head.decode("utf-8", errors="replace")
    odd = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in _TEXT_CONTROLS) or c == "\x7f")
    return odd / len(text)


def _open_zstd(stream: BinaryIO, name: str) -> BinaryIO:
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14

        return zstd.ZstdFile(stream)  # type: ignore[no-any-return]
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]

        return zstandard.ZstdDecompressor().stream_reader(stream)  # type: ignore[no-any-return]
    except ImportError:
        raise InputRefused(
            errno.EINVAL, f"zstd-compressed and no zstd decoder here: run `zstd -dc {name} | ddpdoctor explain`",
            name,
        ) from None


def log_path_refusal(path: str) -> Optional[str]:
    """Why `path` is not a log `explain` may open, or None: kernel and device files (/proc/kmsg blocks
    and eats kernel messages), anything not a regular file."""
    try:
        real = os.path.realpath(path)
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        return (getattr(exc, "strerror", None) or str(exc)).lower()
    if any(_inside(real, d) for d in NOT_LOG_DIRS):
        hint = " (use '-' for standard input)" if real.startswith(("/proc/self/fd", "/dev/std")) or "pipe:" in real else ""
        return f"a kernel or device file ({real}), not a log{hint}"
    if not stat.S_ISREG(mode):
        return f"not a regular file ({describe_file_type(mode)})"
    return None


def open_user_log(path: str) -> BinaryIO:
    """Open a log file named on the command line: never blocks (opened O_NONBLOCK, regular file checked
    on the descriptor, kernel and device files refused), decoded by open_log_stream."""
    reason = log_path_refusal(path)
    if reason is not None:
        raise InputRefused(errno.EINVAL, reason, path)
    fd = _open_regular(path)
    try:
        os.set_blocking(fd, True)
        raw = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    try:
        return open_log_stream(raw, path)
    except BaseException:
        raw.close()
        raise
