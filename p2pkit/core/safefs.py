"""Files root writes, and the directories it trusts, checked before use (issue 40).

Opening: every file p2pkit writes (the state lock and the host lock, artifacts, logs, records, the
units and reports it writes itself) is opened here, never through a link it did not make:
- the last component is never followed: an open is O_NOFOLLOW (a link there is refused: exit 2
  naming it), or the file is written beside it and renamed over it (an atomic write: the link is
  replaced and its target left as it was);
- the directories between an anchor and the file are walked one at a time with
  openat(O_DIRECTORY | O_NOFOLLOW) and made there when missing (0755): a link among them is refused.
  The anchor is the deepest directory p2pkit owns that holds the path (`own()`: the state
  directory; the host's /run for the host lock), else the file's own directory as it is written (a
  path the user named, or a profile path: config.escaping_paths judges where those lead);
- what is found there must be a regular file with no other hard link (a FIFO, a device or a hard
  link to another file is refused before a byte is written; a truncation happens only after that).

Trusting: `check_trusted()` walks a path from / the way the kernel does and refuses it (exit 2,
naming the path, its owner and mode, and the fix) when any directory on the way, or the path
itself, is owned by someone other than root or the running user, or is writable by its group
(unless that group is root's) or by others. A world-writable directory with the sticky bit (/tmp)
may be passed through: its sticky bit keeps others from renaming or removing what they do not
own, and the next component must itself pass (so /tmp/x owned by root is fine, /tmp/x owned by
another user is not). A symlink on the way is followed only when its directory passes and the link
is owned by root or the running user (as the kernel's fs.protected_symlinks and systemd's
CHASE_SAFE judge a link in a sticky directory).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import threading
from pathlib import Path

from p2pkit.core.errors import UsageError

_mu = threading.Lock()
_anchors: dict[str, str] = {}  # an owned directory -> the directory it is reached from without a link
DIR_MODE = 0o755
# The most bytes p2pkit reads from a record it wrote itself (an artifact, profile.json, a backup's manifest,
# a run's marker): its artifacts are tens of KiB; a link to /dev/zero or a file grown without end is
# refused at this size, never read whole (issue 48 item 4).
RECORD_MAX = 16 << 20


class LinkRefused(UsageError):
    """A link (or something else that is not p2pkit's plain file) where p2pkit writes."""


def own(directory: Path | str, base: Path | str | None = None) -> None:
    """From now on, nothing below `directory` (the state directory) is written through a link, and the
    directory itself is reached from `base` (the host's root, when it holds it; else its own parent)
    one component at a time without following a link: a link at the state directory, or at any
    directory between the host's root and it, is refused (issue 48 item 1)."""
    d = os.path.abspath(directory)
    b = os.path.abspath(base) if base is not None else ""
    if not (b and (d == b or d.startswith(b.rstrip("/") + "/"))):
        b = os.path.dirname(d) or "/"
    with _mu:
        if d not in _anchors or len(b) < len(_anchors[d]):
            _anchors[d] = b


def _owned(directory: str) -> bool:
    with _mu:
        return directory in _anchors


def _base_of(directory: str) -> str | None:
    with _mu:
        return _anchors.get(directory)


def anchor_of(path: str) -> str:
    """The deepest owned directory that holds `path`, else the path's own directory."""
    best = ""
    with _mu:
        for a in _anchors:
            if len(a) > len(best) and path.startswith(a.rstrip("/") + "/"):
                best = a
    return best or os.path.dirname(path) or "/"


# ------------------------------------------------------------------------------------------ refusals

def _link_refused(path: str, what: str, reading: bool = False) -> LinkRefused:
    try:
        target = os.readlink(path)
    except OSError:
        target = None
    shown = f"a symbolic link (to {target})" if target is not None else what
    did = ("reads its own records and never through a link it did not make, so it read nothing through it"
           if reading else "writes there as root and never through a link it did not make, so it wrote nothing "
           "through it")
    return LinkRefused(
        f"{path} is {shown}: p2pkit {did}",
        hint=f"remove it (`rm {path}`) and run the same command again; if you did not make it, find out who "
             f"could write to {os.path.dirname(path) or '/'} (`ls -ld {os.path.dirname(path) or '/'}`)")


def _not_plain(path: str, st: os.stat_result) -> LinkRefused:
    if st.st_nlink > 1 and stat.S_ISREG(st.st_mode):
        what = f"a file with {st.st_nlink} hard links (another name shares its content)"
    else:
        what = f"not a regular file ({_kind(st.st_mode)})"
    return LinkRefused(
        f"{path} is {what}: p2pkit writes there as root and writes only its own plain files, so it wrote "
        "nothing there",
        hint=f"remove it (`rm {path}`) and run the same command again; if you did not make it, find out who "
             f"could write to {os.path.dirname(path) or '/'}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK,
                       "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a plain file"


# --------------------------------------------------------------------------------------------- walking

def _open_dir(anchor: str) -> int:
    return os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _descend(fd: int, name: str, shown: str, create: bool) -> int:
    """openat(fd, name) as a directory, never through a link; made (0755) when missing and `create`."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, DIR_MODE, dir_fd=fd)
        except FileExistsError:
            pass
        return _descend(fd, name, shown, False)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.lstat(name, dir_fd=fd)
            if stat.S_ISLNK(st.st_mode):
                raise _link_refused(shown, "a symbolic link") from None
            e.filename = shown
        raise


def _walk(fd: int, top: str, rest: str, create: bool) -> int:
    """Down from the directory `fd` (named `top`) through `rest`, one component at a time without following
    a link (made 0755 where missing and `create`): the last directory's fd. `fd` is consumed."""
    shown = top.rstrip("/")
    try:
        for part in [x for x in rest.split("/") if x]:
            shown = f"{shown}/{part}"
            nxt = _descend(fd, part, shown, create)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_anchor(anchor: str, create: bool) -> int:
    """The anchor's fd: an owned directory (the state directory) reached from its base without following a
    link; any other anchor opened as it is named."""
    base = _base_of(anchor)
    start = base if base is not None else anchor
    try:
        fd = _open_dir(start)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(start, DIR_MODE, exist_ok=True)  # above the anchor: judged by check_trusted
        fd = _open_dir(start)
    return fd if base is None else _walk(fd, base, anchor[len(base):], create)


def parent_fd(path: Path | str, under: Path | str | None = None, create: bool = True,
              make_anchor: bool = False) -> tuple[int, str]:
    """(an fd of the path's directory reached without following a link below its anchor, the last
    component). The caller closes the fd. The directories below the anchor are made when missing;
    the anchor itself when it is an owned one (the state directory) or `make_anchor`. An owned anchor
    is itself reached without a link from its base (own())."""
    p = os.path.abspath(path)
    anchor = os.path.abspath(under) if under is not None else anchor_of(p)
    parent, name = os.path.split(p)
    if not (parent == anchor or parent.startswith(anchor.rstrip("/") + "/")):
        anchor = parent
    fd = _open_anchor(anchor, create and (make_anchor or _owned(anchor)))
    return _walk(fd, anchor, parent[len(anchor):], create), name


def reach(directory: Path | str) -> None:
    """An owned directory (the state directory), when it is there, reached from its base without following
    a link: a link at it or on the way is refused (LinkRefused, exit 2) before anything is read or
    written. Nothing is made."""
    try:
        fd = _open_anchor(os.path.abspath(directory), False)
    except (FileNotFoundError, NotADirectoryError):
        return
    os.close(fd)


def makedirs(path: Path | str, under: Path | str | None = None) -> Path:
    """The directory `path` (made 0755 where missing), no link on the way below its anchor."""
    fd, _ = parent_fd(os.path.join(os.path.abspath(path), "-"), under, make_anchor=True)  # to path itself
    os.close(fd)
    return Path(path)


def open_fd(path: Path | str, flags: int, mode: int = 0o644, under: Path | str | None = None,
            new: bool = False) -> int:
    """os.open for writing, never through a link: O_NOFOLLOW on the file, its directories walked
    from their anchor; O_TRUNC only once the file is known to be p2pkit's plain file. `new`: the
    file must not exist (O_EXCL: a name made for this run)."""
    p = os.path.abspath(path)
    dfd, name = parent_fd(p, under)
    trunc = flags & os.O_TRUNC
    flags = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_EXCL | os.O_CREAT
                                                                                      if new else 0)
    try:
        try:
            fd = os.open(name, flags, mode, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP or (e.errno == errno.EEXIST and new and _is_link(name, dfd)):
                raise _link_refused(p, "a symbolic link") from None
            if e.errno == errno.ENXIO:  # a FIFO with no reader (O_NONBLOCK): never block on it
                raise _not_plain(p, os.lstat(name, dir_fd=dfd)) from None
            e.filename = p
            raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise _not_plain(p, st)
        os.set_blocking(fd, True)
        if trunc:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path | str, limit: int = RECORD_MAX, under: Path | str | None = None) -> bytes:
    """A record p2pkit wrote itself (an artifact, profile.json, a run's marker, a backup's manifest), read
    only as its own regular file of at most `limit` bytes: never through a link (at the file, or among the
    directories below its anchor), never waiting (opened O_NONBLOCK, then fstat: a FIFO, a device or a
    directory is refused before a byte is read), never more than `limit` bytes (a link to /dev/zero, a file
    grown without end). FileNotFoundError as open() raises it; LinkRefused (exit 2) naming what is there."""
    p = os.path.abspath(path)
    dfd, name = parent_fd(p, under, create=False)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link_refused(p, "a symbolic link", reading=True) from None
        e.filename = p
        raise
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _unreadable(p, f"not a regular file ({_kind(st.st_mode)})")
        data = fh.read(limit + 1) if st.st_size <= limit else b""
        if st.st_size > limit or len(data) > limit:
            raise _unreadable(p, f"{max(st.st_size, len(data))} bytes or more, larger than the {limit} bytes "
                                 "a record of p2pkit's may be")
    return data


def read_text(path: Path | str, limit: int = RECORD_MAX) -> str:
    """read_bytes() as UTF-8 text (a record p2pkit wrote: profile.json, secrets.json, reboots.json)."""
    return read_bytes(path, limit).decode("utf-8")


def is_file(path: Path | str) -> bool:
    """Whether a regular file is there, the name itself not followed (a link is not p2pkit's file)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _unreadable(path: str, what: str) -> LinkRefused:
    return LinkRefused(
        f"{path} is {what}: p2pkit reads its records only from its own regular files, never waiting on one "
        "and never more than a record may hold, so it read nothing from it",
        hint=f"remove it (`rm -r {path}`) and run the same command again; if you did not make it, find out who "
             f"could write to {os.path.dirname(path) or '/'}")


def _is_link(name: str, dfd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dfd).st_mode)
    except OSError:
        return False


def open_file(path: Path | str, how: str = "w", mode: int = 0o644, under: Path | str | None = None,
              new: bool = False):
    """open(path, how) for "w", "a", "wb", "ab" (text in UTF-8), through open_fd."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if how.startswith("a") else os.O_TRUNC)
    fd = open_fd(path, flags, mode, under, new)
    return os.fdopen(fd, how, encoding=None if "b" in how else "utf-8")


def write_text(path: Path | str, text: str, mode: int = 0o644, under: Path | str | None = None,
               new: bool = False) -> Path:
    with open_file(path, "w", mode, under, new) as fh:
        fh.write(text)
    return Path(path)


def atomic_write(final: Path | str, data: bytes, mode: int = 0o644, under: Path | str | None = None,
                 fsync: bool = True) -> Path:
    """A temp file made new (O_EXCL) beside `final`, its directory reached without a link, written,
    fsynced, given `mode` and renamed over `final`: a link at `final` is replaced, never followed."""
    p = os.path.abspath(final)
    dfd, name = parent_fd(p, under)
    try:
        stem = name.rsplit(".", 1)[0] if "." in name[1:] else name
        for _ in range(100):
            tmp = f".{stem}.{os.urandom(6).hex()}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dfd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(errno.EEXIST, "no free temporary name", p)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if fsync:
                    os.fsync(fh.fileno())
                os.fchmod(fh.fileno(), mode)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        if fsync:
            os.fsync(dfd)
    finally:
        os.close(dfd)
    return Path(final)


# -------------------------------------------------------------------------------------------- trusting

def _who(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _untrusted(st: os.stat_result, me: int, passing: bool) -> str | None:
    """Why a directory or file with this stat may not be trusted, or None. `passing`: a directory
    the path only passes through (a sticky world-writable one may be)."""
    if st.st_uid not in (0, me):
        return f"is owned by {_who(st.st_uid)}"
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & stat.S_IWOTH and not (passing and sticky):
        return "is writable by every user"
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0 and not (passing and sticky):
        return f"is writable by group {_group(st.st_gid)}"
    return None


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def check_trusted(path: Path | str, what: str, fix: str = "") -> None:
    """Refuse (exit 2) a `path` that someone other than root or the running user could change or
    replace: the path itself (when it exists) and every directory from / to it, links followed as
    the kernel follows them. What does not exist yet is not judged (p2pkit makes it 0755)."""
    found = first_untrusted(path)
    if found:
        raise _distrusted(*found, what, fix)


def first_untrusted(path: Path | str) -> tuple[str, os.stat_result, str] | None:
    """(the first of `path` and the directories from / to it that another user could change, its stat, why), or
    None: check_trusted's judgement without the error."""
    me = os.geteuid()
    todo = [x for x in os.path.abspath(path).split("/") if x]
    cur, hops = "/", 0
    st = os.stat("/")
    why = _untrusted(st, me, passing=bool(todo))
    if why:
        return "/", st, why
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            cur = os.path.dirname(cur) or "/"
            continue
        here = os.path.join(cur, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return None
        except OSError:
            return None  # unreadable: the open that follows says why
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > 40:
                return None
            if st.st_uid not in (0, me):  # a link made by another user (in a sticky /tmp, say)
                return here, st, f"is a symbolic link owned by {_who(st.st_uid)}"
            target = os.readlink(here)
            if target.startswith("/"):
                cur = "/"
            todo = [x for x in target.split("/") if x] + todo
            continue
        why = _untrusted(st, me, passing=bool(todo))
        if why:
            return here, st, why
        cur = here
    return None


def distrusted(found: tuple[str, os.stat_result, str], what: str, fix: str = "") -> UsageError:
    """first_untrusted's finding as check_trusted's refusal."""
    return _distrusted(*found, what, fix)


def _distrusted(path: str, st: os.stat_result, why: str, what: str, fix: str) -> UsageError:
    mode = stat.filemode(st.st_mode)
    owner = f"{_who(st.st_uid)}:{_group(st.st_gid)}"
    if st.st_uid not in (0, os.geteuid()):
        cure = f"`chown root:root {path}`"
    elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and st.st_mode & stat.S_ISVTX:
        # a shared directory by design (/tmp, /var/tmp): taking its write bits breaks every user of the box
        cure = (f"{path} is a shared directory (sticky and writable by every user, as /tmp is): leave its mode "
                f"as it is and use a directory of its own inside it (`mkdir -m 0755 {path.rstrip('/')}/NAME`)")
        return UsageError(f"{what}: {path} {why} ({owner}, {mode}): p2pkit runs as root and reads and writes "
                          "there, so another user could make it write where they choose; nothing was read or "
                          "written", hint=cure + (f"; {fix}" if fix else ""))
    elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
        cure = f"`chmod go-w {path}` (or `chmod +t {path}` for a shared directory others need to write in)"
    else:
        cure = f"`chmod go-w {path}`"
    return UsageError(
        f"{what}: {path} {why} ({owner}, {mode}): p2pkit runs as root and reads and writes there, so another "
        "user could make it write where they choose; nothing was read or written",
        hint=f"{cure}, then run the same command again" + (f"; {fix}" if fix else ""))


# ------------------------------------------------------------------------------------ what root later uses

def place_untrusted(path: Path | str, owners: tuple[int, ...] = ()) -> str | None:
    """Why a place p2pkit wrote (a file or directory root later executes, loads or hands to a service) may
    not be trusted now: owned by someone other than root, the running user or `owners` (the engine's account
    where it owns its directory), or writable by its group (unless root's) or by every user; None when it is
    fine or not there (issue 48 item 2). The message names the path, its owner and mode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    me = os.geteuid()
    if st.st_uid not in (0, me, *owners):
        why = f"is owned by {_who(st.st_uid)}"
    elif st.st_mode & stat.S_IWOTH:
        why = "is writable by every user"
    elif st.st_mode & stat.S_IWGRP and st.st_gid != 0 and st.st_uid not in owners:
        why = f"is writable by group {_group(st.st_gid)}"
    else:
        return None
    return f"{path} {why} ({_who(st.st_uid)}:{_group(st.st_gid)}, {stat.filemode(st.st_mode)})"


def repair_place(path: Path | str, owners: tuple[int, ...] = ()) -> str | None:
    """A place p2pkit wrote made root's again: no group or other write, owned by root where its owner is not
    root, the running user or `owners`; opened without following a link (a link there is item 1's refusal).
    What was done, or None where nothing was wrong."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        done = []
        if st.st_uid not in (0, os.geteuid(), *owners):
            os.fchown(fd, 0, 0)
            done.append(f"owner {_who(st.st_uid)}:{_group(st.st_gid)} -> root:root")
            st = os.fstat(fd)
        if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0 and st.st_uid not in owners):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
            done.append(f"mode {stat.filemode(st.st_mode)} -> {stat.filemode(os.fstat(fd).st_mode)}")
        return f"{path}: {', '.join(done)}" if done else None
    finally:
        os.close(fd)


def repair_tree(top: Path | str, limit: int = 200000) -> list[str]:
    """repair_place over a directory p2pkit made and everything in it (links never followed nor changed)."""
    out = []
    seen = 0
    for d, dirs, files in os.walk(top, followlinks=False):
        for name in [*dirs, *files]:
            seen += 1
            if seen > limit:
                return out
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and (done := repair_place(p)):
                out.append(done)
    return out
