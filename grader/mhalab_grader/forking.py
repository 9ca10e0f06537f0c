"""The prepared grading kernel's side of the fork path (Linux): copied beside the worker as ``_mhalab_fork.py``.

The prepared kernel runs in the sandbox of :mod:`mhalab_grader.sandbox` and has run the instructor's cells
before the first answer cell. For each submission it forks; the child enters namespaces of its own before any
of the learner's code runs, with the kernel's own calls (``unshare``, ``mount``, ``capset``; what bwrap does):

- a user namespace nested in the sandbox's (the same uid; it holds capabilities only over what it owns, and
  drops them all before the learner's code runs), so it may make network, IPC and host-name namespaces of its
  own (a loopback no other submission listens on; no shared System V memory) and
- a mount namespace, where a fresh tmpfs (``disk_mb``, ``inodes``) covers ``/tmp`` (and ``/dev/shm``),
  holding a copy of the prepared kernel's ``/tmp``: no child sees the files of another, nor writes the
  prepared kernel's;
- a pid namespace with a ``/proc`` of its own: no child sees, signals or reads the memory of another, and
  when its first process (pid 1, which only reaps) ends, the kernel ends every process left in it.

The grader reaches the child's worker through the two pipe ends it sent over the prepared kernel's socket.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import stat
import struct
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS = 0x40000000, 0x08000000, 0x04000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC = 0x2, 0x4, 0x8, 0x1000, 0x4000
FORKED: list[int] = []  # the children of the prepared kernel, reaped as they end
_LIBC = ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args) -> None:
    if getattr(_LIBC, name)(*args) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{name}: {os.strerror(error)}")


def _reap() -> None:
    for pid in list(FORKED):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            FORKED.remove(pid)


def fork(request: dict, fd_fork: int, *, closing: tuple) -> tuple[int, tuple[int, int] | None]:
    """In the prepared kernel: (the child's pid, None). In the new submission's worker: (0, its two pipe ends)."""
    _reap()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        raise OSError("CUDA is initialized in the prepared kernel, and a CUDA context does not survive a fork")
    with socket.socket(fileno=os.dup(fd_fork)) as channel:
        _, fds, _, _ = socket.recv_fds(channel, 16, 2)
    if len(fds) != 2:
        raise ValueError("the grader sent no pipe ends")
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        FORKED.append(pid)
        return pid, None
    try:
        for fd in closing:
            os.close(fd)
        _enter(request, fds)
        return 0, (fds[0], fds[1])
    except BaseException as error:  # noqa: B036 (never back into the prepared kernel's loop)
        try:
            from _mhalab_grading import send

            send(fds[1], {"failed": f"{type(error).__name__}: {error}"[:300]})
        finally:
            os._exit(70)


def _enter(request: dict, fds: list[int]) -> None:
    """Namespaces, a fresh /tmp, no capabilities; returns in the worker (pid 2 of the new pid namespace)."""
    uid, gid = os.getuid(), os.getgid()
    _private_memory()
    _call("unshare", CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    init = os.fork()  # the first process of the new pid namespace
    if init:
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(init, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0x7F)
    old = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
    reopen = _unshared_files(keep={old, *fds}, shared=os.fstat(old).st_dev)
    _call("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    size = f"size={int(request['disk_mb'])}m,nr_inodes={int(request['inodes'])},mode=1777".encode()
    _call("mount", b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, size)
    # What the sandbox bound read-only under /tmp (a Python that lives there) is bound again; a bind copies the
    # source mount's flags, read-only included (and they are locked: this namespace cannot make them writable).
    for mount_point in _copy_tree(old, "/tmp"):
        source, target = f"/proc/self/fd/{old}/{mount_point}".encode(), f"/tmp/{mount_point}".encode()
        _call("mount", source, target, None, MS_BIND | MS_REC, None)
    os.close(old)
    os.makedirs("/tmp/.shm", exist_ok=True)
    os.chmod("/tmp/.shm", 0o1777)
    _call("mount", b"/tmp/.shm", b"/dev/shm", None, MS_BIND, None)
    for fd, path, flags, offset in reopen:  # the files it had open in the old /tmp: their copies, at the same place
        if path.endswith(" (deleted)"):  # a copy of its own, nameless as the one it had
            new, position = os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600), 0
            while chunk := os.pread(fd, 1 << 20, position):
                position += os.write(new, chunk)
        else:
            new = os.open(path, flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC))
        os.dup2(new, fd)
        os.close(new)
        if offset is not None:
            os.lseek(fd, offset, os.SEEK_SET)
    os.chdir("/tmp")
    _loopback_up()
    _drop_capabilities()
    worker = os.fork()
    if worker:  # pid 1: reap what is orphaned here; when the worker ends, so does everything in the namespace
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for fd in fds:
            os.close(fd)
        while True:
            pid, status = os.wait()
            if pid == worker:
                os._exit(os.waitstatus_to_exitcode(status) & 0x7F)
    import torch

    torch.set_num_threads(1)  # libgomp's pool does not survive a fork: a second thread would wait forever
    from _mhalab_grading import limit

    limit(request.get("limits", {}))


def _unshared_files(keep: set, shared: int) -> list[tuple[int, str, int, int | None]]:
    """Leave this process no file it would share with another child: its pipes, sockets and other anonymous
    files become /dev/null (closing them would free their numbers for reuse under the objects that hold them);
    list (fd, path, flags, offset) of the files it has open on device ``shared`` (the prepared kernel's /tmp),
    to be opened again on the copy."""
    null = os.open("/dev/null", os.O_RDWR)
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            info, path = os.fstat(fd), os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # (the folder being listed)
        if fd <= 2 or fd in keep:
            continue
        if info.st_dev == shared and (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            offset = os.lseek(fd, 0, os.SEEK_CUR) if stat.S_ISREG(info.st_mode) else None
            found.append((fd, path, fcntl.fcntl(fd, fcntl.F_GETFL), offset))
        elif not any(test(info.st_mode) for test in (stat.S_ISREG, stat.S_ISDIR, stat.S_ISCHR, stat.S_ISBLK)):
            os.dup2(null, fd, inheritable=os.get_inheritable(fd))
    os.close(null)
    return found


def _private_memory() -> None:
    """Every shared writable memory map (torch's shared tensors, multiprocessing's semaphores) becomes a private
    copy at the same address: what the child writes there no other process sees, nor the other way round."""
    _LIBC.mmap.restype = ctypes.c_void_p
    _LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    for line in open("/proc/self/maps").read().splitlines():
        fields = line.split()
        if len(fields) < 2 or "s" not in fields[1] or "w" not in fields[1]:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        content = ctypes.string_at(start, end - start)
        prot = sum(bit for flag, bit in (("r", 1), ("w", 2), ("x", 4)) if flag in fields[1])
        if _LIBC.mmap(start, end - start, prot, 0x02 | 0x20 | 0x10, -1, 0) != start:  # PRIVATE | ANONYMOUS | FIXED
            raise OSError(ctypes.get_errno(), f"a shared memory map ({line[:120]}) could not be made private")
        ctypes.memmove(start, content, end - start)


def _copy_tree(source: int, target: str) -> list[str]:
    """Copy the directory open as ``source`` (the prepared kernel's /tmp) to ``target``: files, folders, links.
    Mount points under it (the sandbox binds a Python that lives under /tmp there, read-only) are not copied:
    each becomes an empty folder, and their paths, relative to ``source``, are returned to be bound again."""
    device, mount_points = os.fstat(source).st_dev, []
    for folder, dirs, files, fd in os.fwalk(".", dir_fd=source):
        here = os.path.normpath(os.path.join(target, folder))
        for name in dirs + files:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            path = os.path.join(here, name)
            if stat.S_ISDIR(info.st_mode):
                os.mkdir(path, stat.S_IMODE(info.st_mode) | 0o700)
                if info.st_dev != device:
                    mount_points.append(os.path.normpath(os.path.join(folder, name)))
            elif stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(name, dir_fd=fd), path)
            elif stat.S_ISREG(info.st_mode):
                src = os.open(name, os.O_RDONLY, dir_fd=fd)
                dst = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(info.st_mode))
                try:
                    while os.sendfile(dst, src, None, 1 << 20):
                        pass
                finally:
                    os.close(src)
                    os.close(dst)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(folder, d)) not in mount_points]
    return mount_points


def _loopback_up() -> None:
    """A loopback of its own, up, as bwrap leaves the sandbox's (SIOCGIFFLAGS, SIOCSIFFLAGS | IFF_UP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(probe, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))


def _drop_capabilities() -> None:
    """No capabilities left in any set (bounding, ambient, effective, permitted, inheritable)."""
    for cap in range(64):
        _LIBC.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability)
    _LIBC.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    _call("capset", header, (ctypes.c_uint32 * 6)())
