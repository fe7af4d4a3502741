"""Another user can never read or rewrite your cache: a name squatted first, a planted pre-filled segment, a
segment more open than asked for, a symlink or a FIFO at the name are all refused (OwnershipError) before a byte is
read or written; sweep and ls skip what they may not touch; TieredCache's stats segments alike. The deliberate
multi-user opt-in (``trust_owner=``, ``mode=``, ``group=``) is tested end to end.

The attacks run in forked children that drop to a second, unprivileged user which the session creates (and always
deletes); where users cannot be created (not root, no useradd) those tests are skipped, saying why."""

from __future__ import annotations

import json
import os
import pickle
import pwd
import select
import shutil
import stat
import subprocess
import time
import traceback

import pytest

from shmcache import OwnershipError, SharedCache, ShmCacheError, sweep
from shmcache.cli import main
from shmcache.tier.stats import Rows, segment_name
from shmcache.trust import Trust

from .conftest import unique_name

SMALL = dict(capacity_bytes=64 * 1024, max_entries=64)
CHILD_S = 60  # bound on an attacker child's run


def _path(name: str) -> str:
    return f"/dev/shm/shmcache.{name}"


def _tier_path(cache: str, namespace: str) -> str:
    return "/dev/shm/" + segment_name(cache, namespace)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@pytest.fixture(scope="session")
def attacker():
    """A second, unprivileged user made for this session (uid, gid), deleted after, whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("creating the attacking user needs root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not on PATH: the attacking user cannot be created")
    user = f"shmc{os.getpid()}"
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                           user], capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        pw = pwd.getpwnam(user)
        yield pw.pw_uid, pw.pw_gid, user
    finally:
        subprocess.run(["userdel", user], capture_output=True, timeout=60)


def as_user(who, fn, *args):
    """``fn(*args)`` run in a forked child as the user ``who`` (uid, gid, name), with no supplementary groups; its
    JSON-able result, or AssertionError with the child's traceback. The child is killed and reaped in any case."""
    uid, gid, _ = who
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            out = json.dumps({"ok": fn(*args)})
        except BaseException:
            out = json.dumps({"error": traceback.format_exc()})
        try:
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + CHILD_S
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"the attacker's child did not finish within {CHILD_S} s"
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    reply = json.loads(b"".join(chunks))
    assert "error" not in reply, f"the attacker's child failed:\n{reply['error']}"
    return reply["ok"]


# What the attacker does, in its child ---------------------------------------------------------------------------------


def _squat(path: str) -> int:
    """Make an empty file at ``path``, open to everyone."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    os.close(fd)
    return os.stat(path).st_uid


def _plant(name: str, value: str) -> None:
    """Make a complete cache at ``name``, open to everyone, holding ``value``."""
    with SharedCache(name, mode=0o666, create=True, **SMALL) as c:
        c.put("k", value)


def _read_as_guest(name: str, mode: int, owner: int) -> str | None:
    """Attach to another user's cache by opting in, and read "k"; "refused: <reason>" if refused."""
    try:
        with SharedCache(name, create=False, mode=mode, trust_owner=owner) as c:
            return c.get("k")
    except OwnershipError as exc:
        return f"refused: {exc.reason}"


def _make_fifo(path: str) -> None:
    os.mkfifo(path, 0o666)


def _plant_tier_stats(cache: str, namespace: str) -> None:
    rows = Rows(cache, namespace, Trust.of(0o666))
    rows.row[0] += 41
    rows.close()


# A name squatted, a segment planted ------------------------------------------------------------------------------


def test_security_squatted_empty_name_is_refused(attacker, name):
    path = _path(name)
    try:
        assert as_user(attacker, _squat, path) == attacker[0]
        for kwargs in (dict(SMALL), dict(SMALL, create=None), {"create": False}):
            with pytest.raises(OwnershipError) as info:
                SharedCache(name, **kwargs)
            assert attacker[2] in str(info.value) and f"uid {attacker[0]}" in str(info.value)
        # Never written to: the attacker's file is still empty, so it holds nothing of ours to read.
        st = os.stat(path)
        assert st.st_size == 0 and st.st_uid == attacker[0]
    finally:
        _remove(path)


@pytest.mark.parametrize("junk", [b"x" * 7, b"\0" * 4096, b"not a shmcache segment" * 1000])
def test_security_squatted_file_of_any_size_is_never_initialised(attacker, name, junk):
    path = _path(name)
    try:
        as_user(attacker, _squat, path)
        with open(path, "r+b") as f:  # as the attacker could have: the file is open to everyone
            f.write(junk)
        with pytest.raises(OwnershipError):
            SharedCache(name, **SMALL)
        with open(path, "rb") as f:
            assert f.read() == junk
    finally:
        _remove(path)


def test_security_planted_segment_is_refused_unless_its_owner_is_trusted(attacker, name):
    path = _path(name)
    try:
        as_user(attacker, _plant, name, "planted")
        assert os.stat(path).st_uid == attacker[0]
        for kwargs in (dict(SMALL), {"create": False}, {"create": False, "mode": 0o666},
                       {"create": False, "trust_owner": attacker[0]}):  # trusted owner, but more open than 0o600
            with pytest.raises(OwnershipError):
                SharedCache(name, **kwargs)
        # The opt-in: trust the owner (by uid or by name) and accept the mode it gave.
        for who in (attacker[0], attacker[2], [attacker[2], 12345]):
            with SharedCache(name, create=False, mode=0o666, trust_owner=who) as c:
                assert c.get("k") == "planted"
    finally:
        _remove(path)


def test_security_other_user_cannot_open_an_owner_only_cache(attacker, name):
    with SharedCache(name, **SMALL) as c:
        c.put("k", "secret")
        reply = as_user(attacker, _read_as_guest, name, 0o666, 0)
    assert reply.startswith("refused:") and "may not open it" in reply


def _vandalise(path: str) -> list[str]:
    """What of reading, truncating (SIGBUS for every process mapping it) and unlinking ``path`` succeeds."""
    done = []
    for what, act in (("read", lambda: open(path, "rb").close()), ("truncate", lambda: os.truncate(path, 0)),
                      ("unlink", lambda: os.unlink(path))):
        try:
            act()
            done.append(what)
        except PermissionError:
            pass
    return done


def test_security_other_user_can_neither_read_truncate_nor_unlink_an_owner_only_cache(attacker, name):
    with SharedCache(name, **SMALL) as c:
        c.put("k", "secret")
        assert as_user(attacker, _vandalise, _path(name)) == []
        assert c.get("k") == "secret" and c.verify().ok


# Deliberate sharing -------------------------------------------------------------------------------------------------


def test_security_group_shared_cache_opens_for_a_user_that_opts_in(attacker, name):
    uid, gid, _ = attacker
    with SharedCache(name, mode=0o660, group=gid, **SMALL) as c:
        st = os.stat(_path(name))
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid
        c.put("k", "shared")
        assert as_user(attacker, _read_as_guest, name, 0o660, "root") == "shared"
        assert as_user(attacker, _read_as_guest, name, 0o660, None).startswith("refused: owned by uid 0")
        assert as_user(attacker, _read_as_guest, name, 0o600, 0).startswith("refused: mode 0660")
        with pytest.raises(OwnershipError, match="open to group"):  # open to another group than asked for
            SharedCache(name, create=False, mode=0o660, group=gid + 1)
        with SharedCache(name, create=False, mode=0o660, group=gid) as same:
            assert same.get("k") == "shared"


def test_security_trust_arguments_are_checked(name):
    for bad in (dict(trust_owner=-1), dict(trust_owner=True), dict(trust_owner="no such user here"),
                dict(trust_owner=[0, 1.5]), dict(group="no such group here"), dict(group=-2), dict(mode=0o1777)):
        with pytest.raises(ValueError):
            SharedCache(name, **bad, **SMALL)
    assert not os.path.exists(_path(name))


# Our own segment, more open than asked ------------------------------------------------------------------------------


def test_security_own_segment_more_open_than_asked_is_refused(name):
    SharedCache(name, **SMALL).close()
    os.chmod(_path(name), 0o666)
    with pytest.raises(OwnershipError) as info:
        SharedCache(name)
    assert "mode 0666" in str(info.value) and "0600" in str(info.value) and info.value.hint
    with SharedCache(name, mode=0o666) as c:  # asked for: accepted
        c.put("k", 1)
        assert c.get("k") == 1


def test_security_narrower_mode_than_asked_is_accepted_and_pickles_with_its_trust(name):
    with SharedCache(name, mode=0o660, **SMALL) as c:
        c.put("k", 1)
        os.chmod(_path(name), 0o640)
        with SharedCache(name, mode=0o660) as narrower:
            assert narrower.get("k") == 1
        os.chmod(_path(name), 0o660)
        with pickle.loads(pickle.dumps(c)) as copy:  # re-attaches asking for 0o660 again
            assert copy.get("k") == 1


def test_security_own_half_made_file_more_open_than_asked_is_not_initialised(name):
    fd = os.open(_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.fchmod(fd, 0o666)
    os.close(fd)
    with pytest.raises(OwnershipError):
        SharedCache(name, **SMALL)
    assert os.stat(_path(name)).st_size == 0


# Symlinks and other files at the name -------------------------------------------------------------------------------


def test_security_symlink_at_the_name_is_never_followed(name, tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    for link_to in (str(target), str(tmp_path / "missing")):
        os.symlink(link_to, _path(name))
        try:
            for kwargs in (dict(SMALL), {"create": False}):
                with pytest.raises(OwnershipError, match="symbolic link"):
                    SharedCache(name, **kwargs)
        finally:
            os.unlink(_path(name))
    assert target.read_bytes() == b"precious" and not (tmp_path / "missing").exists()


def test_security_directory_or_fifo_at_the_name_is_refused(name):
    os.mkdir(_path(name))
    try:
        with pytest.raises(OwnershipError, match="not a regular file"):
            SharedCache(name, **SMALL)
    finally:
        os.rmdir(_path(name))
    os.mkfifo(_path(name), 0o600)
    try:
        with pytest.raises(OwnershipError, match="not a regular file"):
            SharedCache(name, **SMALL)
    finally:
        os.unlink(_path(name))


# sweep and ls -------------------------------------------------------------------------------------------------------


def test_security_sweep_and_ls_skip_what_they_may_not_touch(attacker, name, capsys, tmp_path):
    foreign, fifo, link = unique_name("foreign"), unique_name("fifo"), unique_name("link")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    made = [_path(foreign), _path(fifo), _path(link)]
    try:
        as_user(attacker, _plant, foreign, "planted")  # a complete orphan cache, but the attacker's
        as_user(attacker, _make_fifo, _path(fifo))
        os.symlink(str(victim), _path(link))
        SharedCache(name, **SMALL).close()  # our own orphan
        names = [foreign, fifo, link, name]
        found = {f["name"]: f for f in sweep(names=names)}
        assert found[foreign]["state"] == "skipped" and f"uid {attacker[0]}" in found[foreign]["reason"]
        assert found[fifo]["state"] == "skipped" and "regular" in found[fifo]["reason"]
        assert found[link]["state"] == "skipped" and "symbolic link" in found[link]["reason"]
        assert found[name]["state"] == "orphan"

        assert main(["ls", *names, "--json"]) == 0
        listed = {c["name"]: c for c in json.loads(capsys.readouterr().out) if c["name"] in names}
        assert all(listed[n]["state"] == "skipped" for n in (foreign, fifo, link))
        assert "uid" in listed[foreign]["reason"] and "regular" in listed[fifo]["reason"]
        assert "symbolic link" in listed[link]["reason"] and listed[name]["entries"] == 0
        assert main(["ls", *names]) == 0
        table = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
        assert "skipped: owned by" in table[foreign] and "skipped: a symbolic link" in table[link]

        assert main(["sweep", "--yes", *names]) == 0
        out = capsys.readouterr().out
        assert "skipped: owned by" in out and "removed" in out
        assert all(os.path.lexists(p) for p in made) and not os.path.exists(_path(name))
        assert victim.read_bytes() == b"precious"
        # Trusting the attacker (and its mode) makes its orphan ours to sweep.
        (entry,) = sweep(remove=True, names=[foreign], mode=0o666, trust_owner=attacker[0])
        assert entry["state"] == "orphan" and entry["removed"] and not os.path.exists(_path(foreign))
    finally:
        for p in made:
            _remove(p)


def test_security_cli_and_sweep_skip_own_segment_more_open_than_asked(name, capsys):
    SharedCache(name, mode=0o660, **SMALL).close()
    assert main(["stats", "--json", name]) == 1
    assert "mode 0660" in capsys.readouterr().err
    assert main(["stats", "--json", "--mode", "660", "--trust-owner", "root", "--trust-owner", "0", name]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0
    (entry,) = sweep(remove=True, names=[name])
    assert entry["state"] == "skipped" and "mode 0660" in entry["reason"] and os.path.exists(_path(name))
    (entry,) = sweep(remove=True, names=[name], mode=0o660)
    assert entry["state"] == "orphan" and entry["removed"]


# TieredCache's stats segments ---------------------------------------------------------------------------------------


def test_security_tier_stats_squatted_or_planted_is_refused(attacker, namespace):
    cache = unique_name("tier")
    path = _tier_path(cache, namespace)
    try:
        as_user(attacker, _squat, path)
        with pytest.raises(OwnershipError):
            Rows(cache, namespace)
        assert os.stat(path).st_size == 0  # not sized, not written
        os.unlink(path)

        as_user(attacker, _plant_tier_stats, cache, namespace)
        size = os.stat(path).st_size
        with pytest.raises(OwnershipError):
            Rows(cache, namespace)
        with pytest.raises(OwnershipError):
            Rows(cache, namespace, claim=False)
        rows = Rows(cache, namespace, Trust.of(0o666, attacker[0]), claim=False)  # the opt-in
        try:
            assert int(rows.totals()[0]) == 41 and os.stat(path).st_size == size
        finally:
            rows.close()
        (entry,) = [f for f in sweep(remove=True, names=[cache]) if f["name"] == segment_name(cache, namespace)]
        assert entry["state"] == "skipped" and os.path.exists(path)
    finally:
        _remove(path)


def test_security_tier_stats_symlink_is_never_followed(namespace, tmp_path):
    cache = unique_name("tier")
    path = _tier_path(cache, namespace)
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    os.symlink(str(target), path)
    try:
        with pytest.raises(OwnershipError, match="symbolic link"):
            Rows(cache, namespace)
        (entry,) = [f for f in sweep(remove=True, names=[cache]) if f["name"] == segment_name(cache, namespace)]
        assert entry["state"] == "skipped" and os.path.lexists(path)
    finally:
        _remove(path)
    assert target.read_bytes() == b"precious"


def test_security_tier_stats_claims_rows_in_the_file_checked(namespace):
    cache = unique_name("tier")
    rows = Rows(cache, namespace)
    try:
        os.unlink(rows.path)  # the name now holds nothing (or, were it another's, something else)
        rows.after_fork_in_child()  # claims again: through the checked descriptor, not the name
        rows.row[0] += 1
        assert int(rows.totals()[0]) == 1 and not os.path.exists(rows.path)
        rows.unlink()  # a file at the name that is not ours is left alone: here none
    finally:
        rows.close()
        _remove(_tier_path(cache, namespace))


def test_security_tiered_cache_refuses_a_squatted_stats_segment(attacker, redis_url, namespace, name):
    from shmcache import TieredCache

    with SharedCache(name, **SMALL) as local:
        path = _tier_path(name, namespace)
        try:
            as_user(attacker, _squat, path)
            with pytest.raises(OwnershipError):
                TieredCache(local, redis_url, namespace=namespace)
            assert os.stat(path).st_size == 0
        finally:
            _remove(path)


# The error --------------------------------------------------------------------------------------------------------


def test_security_error_in_hierarchy(name):
    SharedCache(name, **SMALL).close()
    os.chmod(_path(name), 0o644)
    with pytest.raises(PermissionError) as info:
        SharedCache(name)
    err = info.value
    assert isinstance(err, ShmCacheError) and isinstance(err, OwnershipError)
    assert err.what == "attach" and "mode=" in err.hint and err.reason.startswith("mode 0644")
    assert "expected a regular file owned by uid" in str(err) and _path(name) in str(err)
    assert f"`shmcache rm {name}`" in err.hint and "every entry it holds is lost" in err.hint  # the other way out



def _lock_named_after(name: str, tid: int, repairing: bool) -> dict:
    """As the cache's owner: a cache whose mutex owner word names ``tid`` (a live thread of another user's process,
    which cannot open the owner-only segment, so cannot hold its lock), then what every call makes of it."""
    import ctypes

    from shmcache.guard import _REPAIRING
    from shmcache.layout.dtypes import H_DIRTY

    out = {}
    with SharedCache(name, create=True, capacity_bytes=64 * 1024, max_entries=64, lock_timeout=0.3) as c:
        try:
            c.put("k", 1)
            ctypes.c_uint.from_address(c._seg.lock_address).value = tid  # the futex word: held by tid
            if repairing:
                c._seg.header_words[H_DIRTY] = _REPAIRING
            out["get"] = c.get("k")
            out["verify"] = c.verify(repair_damage=True).ok
            out["clear"] = c.clear()
            c.put("k", 2)
            with SharedCache(name, create=False, lock_timeout=0.3) as other:
                out["other"] = other.get("k")
            out["ok"] = c.verify().ok
        finally:
            c.unlink()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("repairing", [False, True], ids=["plain", "dirty-word-repairing"])
def test_security_an_owner_word_naming_a_foreign_process_is_damage(attacker, repairing):
    """The mutex owner word names a live thread of a process of another user, whose /proc/<pid>/maps the cache's
    owner may not read: its uid (from /proc/<pid>/status) cannot open a 0600 segment, so it cannot hold the lock,
    and the lock is repaired after one timeout, not waited for ever."""
    try:
        bystander_uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' to run the bystander process as")
    pid = os.fork()
    if pid == 0:  # the bystander: another user's live process, sleeping
        try:
            os.setgroups([])
            os.setgid(bystander_uid)
            os.setuid(bystander_uid)
            time.sleep(CHILD_S)
        finally:
            os._exit(0)
    try:
        got = as_user(attacker, _lock_named_after, unique_name("foreign"), pid, repairing)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert got["get"] == 1 and got["other"] == 2 and got["verify"] and got["ok"], got  # repaired, not LockTimeout
