"""Whose segments a process may open, and how open they may be: the check every open of a file in /dev/shm makes
before it reads or writes a byte of it.

A file is accepted only if it is a regular file (never a symlink: every open uses O_NOFOLLOW), owned by this
process's effective uid or by a uid the caller trusts (``trust_owner=``), and if its permission bits grant nothing
beyond the ``mode`` asked for (with ``group``: group access to that group only). The check reads the ``fstat`` of the
descriptor that will be used, never a path, so nothing can be swapped in between the check and the use. Root is not
special: a root process refuses another user's segment unless it trusts that user. The checks run only when a file
is opened; the hot path pays nothing.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass

from .errors import OwnershipError, remove_hint
from .layout import SEGMENT_PREFIX

_SHARE_HINT = ("to share a cache between users on purpose, create it with mode=0o660 (and group=) and open it with "
               "the same mode= and trust_owner=<its owner>")


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"gid {gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        return f"gid {gid}"


def _uid(who) -> int:
    if isinstance(who, str):
        try:
            return pwd.getpwnam(who).pw_uid
        except KeyError:
            raise ValueError(f"trust_owner names no user of this host: {who!r}") from None
    if isinstance(who, bool) or not isinstance(who, int) or who < 0:
        raise ValueError(f"trust_owner must be a uid, a user name or an iterable of them, got {who!r}")
    return who


def _gid(group) -> int | None:
    if group is None:
        return None
    if isinstance(group, str):
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"group names no group of this host: {group!r}") from None
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise ValueError(f"group must be a gid or a group name, got {group!r}")
    return group


@dataclass(frozen=True)
class Trust:
    """What a caller accepts: ``mode``, the broadest permissions (and those of a file it creates); ``owners``,
    uids trusted besides its own effective uid; ``gid``, the group a file it creates is given, and the only group an
    accepted file may grant access to (None: the creator's group, and any group when checking)."""

    mode: int = 0o600
    owners: frozenset = frozenset()
    gid: int | None = None

    @classmethod
    def of(cls, mode: int = 0o600, trust_owner=None, group=None) -> Trust:
        """Validated and resolved (user and group names to ids). :raises ValueError: for anything invalid."""
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
            raise ValueError(f"mode must be a permission mode between 0 and 0o777, got {mode!r}")
        owners: frozenset[int]
        if trust_owner is None:
            owners = frozenset()
        elif isinstance(trust_owner, (str, int)):
            owners = frozenset((_uid(trust_owner),))
        else:
            try:
                owners = frozenset(_uid(w) for w in trust_owner)
            except TypeError:
                raise ValueError(f"trust_owner must be a uid, a user name or an iterable of them, "
                                 f"got {trust_owner!r}") from None
        return cls(mode, owners, _gid(group))

    def args(self) -> tuple:
        """(mode, trust_owner, group) as ``of`` takes them: what a pickled handle carries."""
        return self.mode, tuple(sorted(self.owners)), self.gid

    def share(self, fd: int) -> None:
        """Give a file this process just created (with ``mode & 0o700``) its group, then its mode.

        Ordering: owner-only at creation, then the group, then the mode: no one outside the owner and the group
        asked for can open the file at any instant, and a concurrent opener of the same user sees a mode within the
        one asked for (a narrower mode is accepted)."""
        if self.gid is not None:
            os.fchown(fd, -1, self.gid)
        os.fchmod(fd, self.mode)  # shm_open and open honour the umask; the mode asked for is the mode wanted

    def refusal(self, st: os.stat_result) -> str | None:
        """Why the file of ``st`` (an ``fstat``, or an ``lstat`` for a listing) may not be used; None if it may."""
        if stat.S_ISLNK(st.st_mode):
            return "a symbolic link (never followed)"
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        me = os.geteuid()
        if st.st_uid != me and st.st_uid not in self.owners:
            return f"owned by {_user(st.st_uid)}, not by {_user(me)}" + (
                f" nor a trusted owner ({', '.join(_user(u) for u in sorted(self.owners))})" if self.owners else "")
        mode = stat.S_IMODE(st.st_mode)
        if mode & ~self.mode:
            return f"mode {mode:04o}, which grants more than the {self.mode:04o} asked for"
        if self.gid is not None and mode & 0o070 and st.st_gid != self.gid:
            return f"open to group {_group(st.st_gid)}, not to {_group(self.gid)} as asked"
        return None

    def check(self, fd: int, path: str, what: str) -> None:
        """Raise OwnershipError unless the file open as ``fd`` may be used. Call it before any byte is read."""
        st = os.fstat(fd)
        reason = self.refusal(st)
        if reason is not None:
            raise self.error(path, st, reason, what)

    def open_error(self, path: str, what: str) -> OwnershipError | None:
        """After an open of ``path`` failed (EACCES, ELOOP, EISDIR...): the OwnershipError that explains it, from
        an ``lstat`` of the path (the file was not opened, so this only words the refusal); None if none does."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        reason = self.refusal(st)
        if reason is None and not os.access(path, os.R_OK | os.W_OK, effective_ids=True):
            reason = f"this process ({_user(os.geteuid())}) may not open it"
        return None if reason is None else self.error(path, st, reason, what)

    def error(self, path: str, st: os.stat_result, reason: str, what: str) -> OwnershipError:
        """The OwnershipError for the file of ``st`` at ``path``: who owns it, its mode, why, what was expected."""
        mode = stat.S_IMODE(st.st_mode)
        expected = f"a regular file owned by {_user(os.geteuid())}" + (
            " or a trusted owner" if self.owners else "") + f" with a mode within {self.mode:04o}"
        if reason.startswith("mode"):
            cache = os.path.basename(path)
            remove = (remove_hint(cache[len(SEGMENT_PREFIX):]) if cache.startswith(SEGMENT_PREFIX) else
                      "remove it and create it again")
            hint = f"if this sharing is intended, pass mode=0o{mode | self.mode:o}; otherwise {remove}"
        else:
            hint = ("if it is not yours, do not use it: have its owner or root remove it, and choose another name "
                    f"meanwhile; {_SHARE_HINT}")
        return OwnershipError(f"refused {path}, owned by {_user(st.st_uid)} with mode {mode:04o}: {reason}; "
                              f"expected {expected}", what=what, hint=hint, reason=reason)
