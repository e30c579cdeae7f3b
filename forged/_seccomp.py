"""The seccomp filter of the sandbox: a small classic-BPF program, built here, that bubblewrap
loads (``--seccomp FD``) into every confined process before it runs the command.

What it refuses, with ``EPERM``, so that no confined process can reach a Unix socket of the
host however the filesystem is mounted (a read-only bind does not stop ``connect(2)``):

- ``socket(AF_UNIX, ...)``: no new Unix socket, so nothing can connect to one by path
  (forged's daemon, the session bus, an ssh or gpg agent, Docker);
- ``socket(AF_VSOCK, ...)``, even where Unix sockets are allowed: vsock reaches the
  hypervisor and the other machines of a VM host, and no network namespace covers it;
- ``socketpair`` of any type but ``SOCK_STREAM`` and ``SOCK_SEQPACKET``: such pairs are made
  connected and cannot be pointed elsewhere, while a datagram one could ``sendto`` any
  datagram socket by path (journald, syslog's ``/dev/log``);
- ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``: io_uring makes sockets and
  connects them without those system calls (``IORING_OP_SOCKET``);
- on x86-64, the x32 numbering of every call (``nr | 0x40000000``), where the same calls
  have other numbers.

A process of another architecture than the filter's (a 32-bit program through the kernel's
compatibility entry, where ``socketcall`` multiplexes every socket call behind a pointer the
filter cannot read) is killed at its first system call. Everything else is allowed.

Why our own program and not libseccomp: the whole policy is these few rules, which fit in 20
instructions a reader can check against the kernel's ``struct seccomp_data``; libseccomp's
Python bindings are not on PyPI for every Python (and loading them through ctypes costs more
than building this), and a machine without its shared library would have no sandbox. An
architecture the table below does not know gets no filter, and the sandbox then refuses to
run anything (`program` raises).
"""

from __future__ import annotations

import functools
import platform
import struct

import attrs

from ._errors import UnknownArchitecture

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
# A 32-bit load at an argument's offset reads its low word (these are little-endian CPUs),
# which is all the kernel reads of an int argument.
_NR = 0
_ARCH = 4


def _arg(index: int) -> int:
    return 16 + 8 * index


# Classic BPF, as <linux/filter.h> and <linux/bpf_common.h> number it.
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_AND_K = 0x54
_RET_K = 0x06

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
EPERM = 1
AF_UNIX = 1
AF_VSOCK = 40
SOCK_STREAM = 1
SOCK_SEQPACKET = 5
SOCK_TYPE_MASK = 0xF
"""``socketpair``'s type carries ``SOCK_NONBLOCK`` and ``SOCK_CLOEXEC`` above these bits."""
X32_SYSCALL_BIT = 0x40000000


@attrs.frozen
class Architecture:
    audit: int
    """``AUDIT_ARCH_*``: what the kernel puts in ``seccomp_data.arch``."""
    socket: int
    socketpair: int
    io_uring: tuple[int, int, int]
    x32: bool = False


ARCHITECTURES = {
    "x86_64": Architecture(audit=0xC000003E, socket=41, socketpair=53,
                           io_uring=(425, 426, 427), x32=True),
    # The generic numbering (asm-generic/unistd.h).
    "aarch64": Architecture(audit=0xC00000B7, socket=198, socketpair=199,
                            io_uring=(425, 426, 427)),
    "riscv64": Architecture(audit=0xC00000F3, socket=198, socketpair=199,
                            io_uring=(425, 426, 427)),
}
ARCHITECTURES["amd64"] = ARCHITECTURES["x86_64"]
ARCHITECTURES["arm64"] = ARCHITECTURES["aarch64"]


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@functools.cache
def program(machine: str | None = None, *, unix_sockets: bool = False) -> bytes:
    """The filter for `machine` (default: this one's, as ``platform.machine()`` names it), as
    the bytes of a ``struct sock_filter`` array, which is what bubblewrap's ``--seccomp``
    reads. With `unix_sockets`, ``socket(AF_UNIX)`` and every ``socketpair`` are allowed
    (``sandbox.allowUnixSockets``); the rest holds. `UnknownArchitecture` when none is
    known for it."""
    name = machine or platform.machine()
    arch = ARCHITECTURES.get(name.lower())
    if arch is None:
        raise UnknownArchitecture(
            f"forged's seccomp filter knows x86-64, AArch64 and RISC-V 64, not {name}")
    # Symbolic jump targets, resolved to offsets once the whole program is laid out.
    labels: dict[str, int] = {}
    code: list[tuple[int, int, str | int, str | int]] = []

    def emit(op: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        code.append((op, k, jt, jf))

    def label(name: str) -> None:
        labels[name] = len(code)

    emit(_LD_W_ABS, _ARCH)
    emit(_JEQ_K, arch.audit, 0, "kill")
    emit(_LD_W_ABS, _NR)
    if arch.x32:
        emit(_JGE_K, X32_SYSCALL_BIT, "deny", 0)
    for number in arch.io_uring:
        emit(_JEQ_K, number, "deny", 0)
    emit(_JEQ_K, arch.socket, "socket", 0)
    if not unix_sockets:
        emit(_JEQ_K, arch.socketpair, "socketpair", 0)
    emit(_RET_K, RET_ALLOW)
    label("socket")
    emit(_LD_W_ABS, _arg(0))
    emit(_JEQ_K, AF_VSOCK, "deny", 0)
    emit(_JEQ_K, AF_UNIX, 0 if unix_sockets else "deny", "allow")
    emit(_RET_K, RET_ALLOW)
    if not unix_sockets:
        label("socketpair")
        emit(_LD_W_ABS, _arg(1))
        emit(_AND_K, SOCK_TYPE_MASK)
        emit(_JEQ_K, SOCK_STREAM, "allow", 0)
        emit(_JEQ_K, SOCK_SEQPACKET, "allow", "deny")
    label("allow")
    emit(_RET_K, RET_ALLOW)
    label("deny")
    emit(_RET_K, RET_ERRNO | EPERM)
    label("kill")
    emit(_RET_K, RET_KILL_PROCESS)
    out = bytearray()
    for index, (op, k, jt, jf) in enumerate(code):
        offsets = [labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= offset < 256 for offset in offsets), "a jump out of reach"
        out += _insn(op, k, *offsets)
    return bytes(out)
