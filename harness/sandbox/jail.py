"""Stage 0 of a sandboxed run: a private root filesystem, then an unprivileged user.

Standard library only. The sandbox child (child.py) loads this file by path and calls `enter(spec)`
as the first thing it does, while it is still root inside the fresh mount, pid, network, ipc and uts
namespaces that `unshare` gave it (harness/sandbox/execute.py, backend "unshare"). Afterwards the
process:

- sees a new root: an empty tmpfs holding only read-only binds of the system's program folders
  (/usr and its /bin, /lib... links) and the interpreter's prefix, a minimal /dev (null, zero,
  random, urandom), and two private tmpfs folders, its working directory and /tmp, each
  capped in bytes and in files (inodes). There is no /proc, /sys, /dev/shm, /run or /home, and none
  of the host's own files: nothing outside can be read, named or written;
- runs as uid/gid 65534 with no supplementary groups, so it holds no capability and cannot undo
  any of this (chroot, mount, setuid need capabilities); no_new_privs is set, and SIGKILL is its
  parent-death signal again (changing the uid clears the one `unshare --kill-child` set);
- is not dumpable, so no other process of the same uid can read its memory.

Every step is a system call that fails loudly: a run never starts half-jailed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import struct

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1
DEVICES = ("null", "zero", "random", "urandom")


class JailError(RuntimeError):
    """A step of the jail failed; the run must not go on."""


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise JailError(f"jail: {what}: {os.strerror(err)}")


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {source or ''} {target}")


def _read_only(libc, target: str) -> None:
    """Make a bind mount and every mount below it read-only (mount_setattr; one level on old kernels)."""
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0)
    res = libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, target.encode(), AT_RECURSIVE, attr, len(attr))
    if res == 0:
        return
    if ctypes.get_errno() != errno.ENOSYS:
        _check(res, f"read-only {target}")
    _mount(libc, None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _bind(libc, new_root: str, path: str) -> None:
    """`path` of the host at the same place under the new root, read-only; a symbolic link (as /bin
    is on a merged-/usr system) is recreated as the same link."""
    inside = new_root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        os.symlink(os.readlink(path), inside)
        return
    if not os.path.exists(path):
        return
    os.makedirs(inside, exist_ok=True)
    _mount(libc, path, inside, None, MS_BIND | MS_REC)
    _read_only(libc, inside)


def _private_tmpfs(libc, target: str, size_bytes: int, files: int, uid: int) -> None:
    os.makedirs(target, exist_ok=True)
    _mount(libc, "tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={size_bytes},nr_inodes={files},mode=0700,uid={uid},gid={uid}")


def _devices(libc, new_root: str) -> None:
    dev = new_root + "/dev"
    os.makedirs(dev)
    _mount(libc, "tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=16,mode=0755")
    for name in DEVICES:
        node = f"{dev}/{name}"
        open(node, "w").close()
        _mount(libc, f"/dev/{name}", node, None, MS_BIND)
    _mount(libc, None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def enter(spec: dict) -> str:
    """Build the jail described by `spec` and drop into it; returns the working directory inside.

    spec: {"root": an empty host folder to mount the new root on, "binds": host paths to show
    read-only, "work": the working directory inside, "work_bytes": size of it and of /tmp,
    "work_files": files (inodes) in each, "uid": the user to become}."""
    libc = _libc()
    new_root, uid = spec["root"], int(spec["uid"])
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing of what follows reaches the host
    _mount(libc, "jail", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for path in spec["binds"]:
        _bind(libc, new_root, path)
    _devices(libc, new_root)
    _private_tmpfs(libc, new_root + spec["work"], spec["work_bytes"], spec["work_files"], uid)
    _private_tmpfs(libc, new_root + "/tmp", spec["work_bytes"], spec["work_files"], uid)
    _mount(libc, None, new_root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(new_root)
    os.chroot(".")
    os.chdir(spec["work"])
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from uid 0 to another: every capability is gone
    if os.getuid() != uid or os.geteuid() != uid:
        raise JailError(f"jail: still uid {os.geteuid()} after setresuid({uid})")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "parent-death signal")
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
    return spec["work"]
