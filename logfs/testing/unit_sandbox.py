"""Run a command under the process restrictions of a systemd unit that the kernel can apply without systemd.

    python -m logfs.testing.unit_sandbox UNIT_FILE -- COMMAND [ARGS...]

systemd applies most of a unit's hardening in the child it forks, just before execve(); nothing of it needs
systemd to be PID 1 except what lives in cgroups (DevicePolicy/DeviceAllow) and namespaces. This helper does the
same in its own process and then execs COMMAND, reading the settings from the unit file:

- ``NoNewPrivileges=yes``: ``prctl(PR_SET_NO_NEW_PRIVS)``;
- ``CapabilityBoundingSet=``: every capability not listed is dropped from the bounding set
  (``PR_CAPBSET_DROP``), so a root COMMAND execs with only those, as under the unit;
- ``UMask=``, ``LimitNOFILE=`` (capped at this process's hard limit, which only systemd could raise);
- ``SystemCallFilter=`` (groups expanded by ``systemd-analyze syscall-filter``), ``SystemCallErrorNumber=``,
  ``SystemCallArchitectures=native`` and ``RestrictAddressFamilies=`` as ONE seccomp filter of the same shape
  systemd installs: another architecture's calls fail, ``socket(2)`` with a family not listed fails with
  ``EAFNOSUPPORT``, a system call not listed fails with the configured errno.

Not applied (they need systemd's cgroups or namespaces): DevicePolicy/DeviceAllow, RestrictNamespaces,
RestrictRealtime, RestrictSUIDSGID, LockPersonality. x86-64 only (the test skips elsewhere).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import resource
import socket
import struct
import subprocess
import sys
from pathlib import Path


UNISTD_64 = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# classic BPF
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
OFF_NR, OFF_ARCH, OFF_ARG0_LOW = 0, 4, 16

CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
]


def unit_settings(path: Path) -> dict[str, list[tuple[str, str]]]:
    """{section: [(key, value), ...]} of a unit file (comments dropped, continuation lines joined)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        sections.setdefault(current, []).append((key.strip(), value.strip()))
    return sections



def syscall_numbers() -> dict[str, int]:
    text = Path(UNISTD_64).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)", text)}


def expand_syscalls(names: list[str], seen: set[str] | None = None) -> set[str]:
    """System call names of a SystemCallFilter= list, groups (``@name``) expanded by systemd-analyze."""
    seen = set() if seen is None else seen
    out: set[str] = set()
    for name in names:
        if not name.startswith("@"):
            out.add(name)
            continue
        if name in seen:
            continue
        seen.add(name)
        listing = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager", name], capture_output=True,
                                 text=True, check=True).stdout
        members = [line.strip() for line in listing.splitlines()[1:]
                   if line.strip() and not line.strip().startswith("#")]
        out |= expand_syscalls(members, seen)
    return out


def families(names: list[str]) -> set[int]:
    return {int(getattr(socket, name)) for name in names}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_filter(allowed_syscalls: set[int], allowed_families: set[int], syscall_errno: int) -> bytes:
    """The filter program: arch check, x32 check, socket(2)'s family, then the allow list; default: errno."""
    deny = SECCOMP_RET_ERRNO | syscall_errno
    prog = [
        _insn(BPF_LD_W_ABS, OFF_ARCH),
        _insn(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        _insn(BPF_RET_K, deny),
        _insn(BPF_LD_W_ABS, OFF_NR),
        _insn(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        _insn(BPF_RET_K, deny),
    ]
    socket_nr = syscall_numbers()["socket"]
    if socket_nr in allowed_syscalls:
        # if nr == socket: family listed -> allow, else EAFNOSUPPORT (the accumulator is reloaded after)
        checks = [_insn(BPF_JEQ_K, fam, len(allowed_families) - i, 0) for i, fam in enumerate(sorted(allowed_families))]
        prog += [_insn(BPF_JEQ_K, socket_nr, 0, len(checks) + 3), _insn(BPF_LD_W_ABS, OFF_ARG0_LOW), *checks,
                 _insn(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT), _insn(BPF_RET_K, SECCOMP_RET_ALLOW)]
    for nr in sorted(allowed_syscalls):
        prog += [_insn(BPF_JEQ_K, nr, 0, 1), _insn(BPF_RET_K, SECCOMP_RET_ALLOW)]
    prog.append(_insn(BPF_RET_K, deny))
    return b"".join(prog)


def apply(unit: Path) -> None:
    service = unit_settings(unit)["Service"]

    def values(key: str) -> list[str]:
        return [w for k, v in service if k == key for w in v.split()]

    libc = ctypes.CDLL(None, use_errno=True)

    def prctl(*args) -> None:
        if libc.prctl(*[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args]) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl{args[:2]}: {os.strerror(e)}")

    if values("UMask"):
        os.umask(int(values("UMask")[0], 8))
    if values("LimitNOFILE"):
        n = int(values("LimitNOFILE")[0])
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # a container's hard limit may be lower
        n = n if hard == resource.RLIM_INFINITY else min(n, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    keep = set(values("CapabilityBoundingSet"))
    if keep:
        for number, name in enumerate(CAPABILITIES):
            if name not in keep:
                try:
                    prctl(PR_CAPBSET_DROP, number, 0, 0, 0)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:  # a capability this kernel does not have
                        raise
    if values("NoNewPrivileges") == ["yes"]:
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    syscall_filter = values("SystemCallFilter")
    address_families = values("RestrictAddressFamilies")
    if syscall_filter or address_families:
        assert values("SystemCallArchitectures") in ([], ["native"])
        numbers = syscall_numbers()
        if syscall_filter:
            assert not syscall_filter[0].startswith("~"), "deny lists are not handled here"
            allowed = {numbers[n] for n in expand_syscalls(syscall_filter) if n in numbers}
        else:
            allowed = set(numbers.values())
        allowed_families = families(address_families) if address_families else set(range(64))
        err_name = (values("SystemCallErrorNumber") or ["EPERM"])[0]
        program = build_filter(allowed, allowed_families, getattr(errno, err_name))

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        fprog = SockFprog(len(program) // 8, program)
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit(__doc__.split("\n\n")[1])
    apply(Path(argv[0]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
