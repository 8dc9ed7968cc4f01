"""Confines a pod's processes with Linux Landlock: write only the task's own folders, read only what it needs.

`python -I …/simrun_runtime/confine.py --read PATH… --write PATH… -- COMMAND…` (or `-m simrun_runtime.confine`)
restricts itself, then execs COMMAND,
so every process of the pod (the runtime, its pool, the model's units, merges and commands) runs inside one
Landlock domain that no descendant can leave. Paths not named are neither readable nor writable; the
interpreter's own installation (its prefixes and `sys.path`) and a short list of system files are readable.

Why Landlock (see DESIGN.md, "Containment"): it needs no privilege, works the same for root and other users,
is enforced by the kernel on every path (a file's mode does not matter, so making a snapshot file writable
gains nothing), refuses hard links and renames out of read-only trees (`REFER`), and its scopes keep a pod from
signalling or ptracing processes outside its domain (the server, other pods). Mount namespaces alone need root
and leave signals open. The launcher adds what Landlock does not cover: a private mount namespace in which
everything but the pod's write paths is mounted read-only (so `chmod`, `chown` and `utime` fail with EROFS),
entered through a user namespace of the pod's own where the server is not root, and for root it drops every
capability before the exec (no kernel modules, no clock, no bypassing file modes).

The standard library only (ctypes): this module ships in every image.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import glob
import os
import socket
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROG = "simrun-confine"

# System calls, the same numbers on x86_64 and aarch64 (the generic table).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40
_CAPABILITY_VERSION_3 = 0x20080522
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_KEEP_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC}
SHARED_MEMORY = "/dev/shm"
PROC = "/proc"
_LEFT_WRITABLE = (PROC, SHARED_MEMORY)
"""Mounts the read-only view keeps as they are: /proc (Landlock already refuses writes there) and /dev/shm (a
private tmpfs replaces it)."""

# Filesystem access rights (linux/landlock.h) and the ABI that introduced each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: link or rename into another directory
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_ABI1 = (1 << 13) - 1
_HANDLED_BY_ABI = {1: _ABI1, 2: _ABI1 | REFER, 3: _ABI1 | REFER | TRUNCATE, 4: _ABI1 | REFER | TRUNCATE}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_SYM
WRITE |= REFER | TRUNCATE
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV

SYSTEM_READ = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/proc",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/protocols",
    "/etc/services",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/mime.types",
    "/etc/os-release",
    "/etc/alternatives",
)
"""What every process reads of the system: programs and libraries, /proc (another process's private files stay
closed: Landlock refuses ptrace access across domains), and the few files of /etc a runtime reads. Not /etc as a
whole (it holds /etc/shadow and service credentials), not /home, /root, /tmp or /var."""

SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
SYSTEM_WRITE = ("/dev/shm",)
"""POSIX semaphores of `multiprocessing` live in /dev/shm."""


def _accelerators() -> list[str]:
    """The GPU devices of this machine (NVIDIA, DRM render nodes): a task that asks for GPUs opens them."""
    found: list[str] = []
    for pattern in ("/dev/nvidia*", "/dev/dri/renderD*"):
        found.extend(glob.glob(pattern))
    return found


class ConfineError(Exception):
    """Landlock cannot be applied here: the kernel lacks it, or a rule is refused."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel; 0 where Landlock is missing or disabled."""
    try:
        libc = _libc()
    except OSError:
        return 0
    version = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass
class Rules:
    """Which paths a confined process may read and write; everything else is closed to it."""

    read: list[Path] = field(default_factory=list)
    write: list[Path] = field(default_factory=list)
    devices: list[Path] = field(default_factory=list)

    @classmethod
    def for_pod(cls, read: Iterable[Path | str], write: Iterable[Path | str]) -> Rules:
        """The given paths plus what every process needs: the system, this interpreter's installation."""
        return cls(
            read=[Path(p) for p in (*SYSTEM_READ, *interpreter_paths(), *read)],
            write=[Path(p) for p in (*SYSTEM_WRITE, *write)],
            devices=[Path(p) for p in (*SYSTEM_DEVICES, *_accelerators())],
        )


def interpreter_paths() -> list[str]:
    """This interpreter's installation: its prefixes and the entries of `sys.path` (editable installs included).

    The working directory (the first entry under `-m`) and this script's own folder are the caller's business,
    not the interpreter's, and are left out.
    """
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    skip = {"", os.getcwd(), os.path.dirname(os.path.abspath(sys.argv[0] if sys.argv and sys.argv[0] else "."))}
    paths.update(p for p in sys.path if p not in skip)
    return sorted(paths)


LAUNCHER = os.path.abspath(__file__)
"""This file: run as `python -I <LAUNCHER> …`, it imports the standard library only, not the runtime package
(whose imports cost seconds on a loaded machine and which the pod's command imports again anyway)."""


def launcher_command(
    command: Sequence[str],
    read: Iterable[Path | str],
    write: Iterable[Path | str],
    interpreter: str | None = None,
    umask: int | None = None,
) -> list[str]:
    """`command` run by this launcher with these paths (`python -I <LAUNCHER> --read … --write … -- command`)."""
    launcher = [interpreter or sys.executable, "-I", LAUNCHER]
    for path in read:
        launcher += ["--read", str(path)]
    for path in write:
        launcher += ["--write", str(path)]
    if umask is not None:
        launcher += ["--umask", f"{umask:o}"]
    return [*launcher, "--", *command]


def apply(rules: Rules) -> int:
    """Restricts this process (and every process it starts) to `rules`; returns the ABI used.

    Raises:
        ConfineError: Landlock is missing, or the kernel refuses a step.
    """
    abi = landlock_abi()
    if abi < 1:
        raise ConfineError("this kernel has no Landlock (Linux 5.13+ with lsm=landlock)")
    libc = _libc()
    handled = _HANDLED_BY_ABI.get(abi, _ABI1 | REFER | TRUNCATE | IOCTL_DEV)
    attr = _RulesetAttr(handled, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise ConfineError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for rights, paths in ((READ, rules.read), (WRITE, rules.write), (DEVICE, rules.devices)):
            for path in paths:
                _add_rule(libc, int(ruleset), path, rights & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfineError(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise ConfineError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(int(ruleset))
    return abi


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: Path, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # a system path this machine lacks (/lib32), or a folder not made yet
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), 0):
            raise ConfineError(f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None, data: str = "") -> int:
    """mount(2): 0, or -1 with the reason in `ctypes.get_errno()`."""
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return int(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            ctypes.c_char_p(data.encode()) if data else None,
        )
    )


def read_only_view(write: Sequence[Path], user_namespace: bool = False) -> None:
    """A private mount namespace in which every mount is read-only except the `write` paths.

    Landlock governs opening, creating, linking and renaming, but not `chmod`, `chown` or `utime`: a pod owns
    the files of the server's user (for root, the system's too) and could change their modes: a snapshot file
    made writable, a set-uid bit on a system binary, or the home and its token opened to every local account
    (the bytes stay closed to the pod, not to the other accounts). On a read-only mount those calls fail with
    EROFS. Root makes the namespace directly; an unprivileged server's pod first enters a user namespace of its
    own (`user_namespace`) that maps its user to itself, which lets it make mounts and changes nothing else.

    Raises:
        ConfineError: the namespace or a mount cannot be made.
    """
    libc = _libc()
    if user_namespace:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
            raise ConfineError(f"unshare(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}")
        try:
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError as exc:
            raise ConfineError(f"mapping the user into its namespace: {exc.strerror}") from None
    elif libc.unshare(_CLONE_NEWNS) != 0:
        raise ConfineError(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    if _mount(None, "/", _MS_REC | _MS_PRIVATE) != 0:
        raise ConfineError(f"making / private: {os.strerror(ctypes.get_errno())}")
    for point, options in _mounts():
        if any(point == keep or point.startswith(keep + "/") for keep in _LEFT_WRITABLE):
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for name, flag in _KEEP_FLAGS.items():
            if name in options:
                flags |= flag
        # EACCES: the pod's user may not search the way to the mount (podman's storage under a 0700
        # /var/lib/containers), so it cannot reach the files there to change their modes either.
        if _mount(None, point, flags) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT, errno.EACCES):
            raise ConfineError(f"remounting {point} read-only: {os.strerror(ctypes.get_errno())}")
    for path in write:
        if not os.path.isdir(path):
            continue
        target = os.path.realpath(path)
        if _mount(target, target, _MS_BIND | _MS_REC) != 0 or _mount(None, target, _MS_REMOUNT | _MS_BIND) != 0:
            raise ConfineError(f"mounting {target} writable: {os.strerror(ctypes.get_errno())}")
    # A /dev/shm of the pod's own: the shared one let a pod read and change another run's shared memory
    # (multiprocessing's, a library's tensors). Its pages count in the pod's memory cgroup.
    if os.path.isdir(SHARED_MEMORY) and _mount("tmpfs", SHARED_MEMORY, _MS_NOSUID | _MS_NODEV, "tmpfs", "mode=1777"):
        raise ConfineError(f"mounting a private {SHARED_MEMORY}: {os.strerror(ctypes.get_errno())}")


def private_proc() -> None:
    """Mounts, in the pod's mount namespace (`read_only_view`), a /proc of its own that lists only the processes
    it may ptrace, which Landlock refuses across domains: the shared one let a pod read every other process's
    command line and status (the server's, other runs' pods, every account's), which need no ptrace right. Only
    root can: a user namespace of the pod's own does not own the PID namespace.

    Raises:
        ConfineError: the mount is refused (a container that masks parts of its /proc, a kernel before 5.8).
    """
    if _mount("proc", PROC, _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "proc", "hidepid=ptraceable") != 0:
        raise ConfineError(f"mounting a private {PROC}: {os.strerror(ctypes.get_errno())}")


def isolate_network() -> None:
    """A network namespace of the pod's own, with only its loopback (up): the pod reaches no address outside it,
    neither this machine's other services (the server's own API among them) nor another machine, and its own
    processes still talk over 127.0.0.1. Called after `read_only_view`, whose user namespace (for a server that is
    not root) holds the right to make it.

    Raises:
        ConfineError: the namespace cannot be made, or its loopback not brought up.
    """
    if _libc().unshare(_CLONE_NEWNET) != 0:
        raise ConfineError(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        try:
            fcntl.ioctl(control, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", _IFF_UP_LOOPBACK_RUNNING))
        except OSError as exc:
            raise ConfineError(f"bringing the pod's loopback up: {exc.strerror}") from None


def _mounts() -> list[tuple[str, set[str]]]:
    """The mount points of this namespace with their options, parents before children."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        found.append((point, set(fields[5].split(","))))
    return sorted(found, key=lambda item: item[0].count("/") if item[0] != "/" else 0)


def drop_capabilities() -> None:
    """For root: empties the bounding and ambient sets, so the exec'd program holds no capability at all."""
    if os.geteuid() != 0:
        return
    libc = _libc()
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() not in (errno.EINVAL,):
            raise ConfineError(f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ctypes.get_errno())}")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    # Root's exec grants the inheritable set whatever the bounding set says (a container runtime may leave one):
    # empty it, keeping the effective and permitted sets the exec drops anyway.
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capget(header, data) != 0:
        raise ConfineError(f"capget: {os.strerror(ctypes.get_errno())}")
    data[2] = data[5] = 0  # inheritable, both words of {effective, permitted, inheritable}
    if libc.capset(header, data) != 0:
        raise ConfineError(f"capset: {os.strerror(ctypes.get_errno())}")


def main(argv: Sequence[str] | None = None) -> int:
    """Confines itself to the given paths, then execs the command; exit 126 when it cannot confine."""
    parser = argparse.ArgumentParser(prog=PROG, description="Run a command confined by Landlock.")
    parser.add_argument("--read", action="append", default=[], type=Path, help="a path the command may read")
    parser.add_argument("--write", action="append", default=[], type=Path, help="a path the command may write")
    parser.add_argument("--umask", type=lambda s: int(s, 8), default=0o077, help="the command's umask (octal)")
    parser.add_argument("--no-network", action="store_true", help="a network namespace of its own: its loopback only")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give it after --")
    try:
        if os.geteuid() == 0:
            read_only_view(args.write)
            try:
                private_proc()
            except ConfineError as exc:
                print(f"{PROG}: no private /proc ({exc}): the pod sees every process's command line", file=sys.stderr)
        else:
            try:
                read_only_view(args.write, user_namespace=True)
            except ConfineError as exc:
                # Landlock still confines every read and write; only modes stay changeable.
                print(
                    f"{PROG}: no read-only view ({exc}): the pod may change the modes of its user's files",
                    file=sys.stderr,
                )
        if args.no_network:
            isolate_network()
        apply(Rules.for_pod(args.read, args.write))
        drop_capabilities()
    except ConfineError as exc:
        print(f"{PROG}: cannot confine the pod: {exc}", file=sys.stderr)
        return 126
    os.umask(args.umask)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"{PROG}: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 127  # unreachable: exec replaced the process


if __name__ == "__main__":
    raise SystemExit(main())
