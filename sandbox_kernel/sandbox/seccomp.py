"""The seccomp filter every sandbox runs under: one rule table, two outputs.

Why a filter at all: some kernel interfaces are not namespaced (AF_VSOCK, the
keyrings, bpf, perf, io_uring) or let a process reach outside its namespaces
(ptrace, mount, new user namespaces, TIOCSTI), and the sandbox can plant
symlinks, FIFOs and device nodes (mknod, or the whiteout renameat2 leaves)
that a host program (jupyter_server saving a notebook) would later follow,
and set-uid or set-gid files that any host account could run as the
sandbox's host uid. Namespaces and dropped capabilities do not close these;
a syscall filter does.

The same :data:`RULES` produce

- a classic-BPF program for bubblewrap (``bwrap --seccomp FD``), compiled on
  the host with libseccomp (through ``pyseccomp``) once per process, so the
  worker inside the sandbox needs nothing; and
- a Docker seccomp profile (``security_opt=["seccomp=<json>"]``),

so the two backends cannot drift apart. The filter is a deny list over a
default of ALLOW: every refusal is ``EPERM`` (``ENOSYS`` for ``clone3`` and
``openat2``, so callers fall back to ``clone`` and ``openat``, whose flags and
mode *can* be inspected), never a kill, so well-behaved code sees an ordinary
``OSError``.

A rule's comparisons are ANDed and each is on a different argument; several
rules for one syscall are ORed. That is the only shape both libseccomp (which
refuses two comparisons of one argument in a rule) and runc (which ORs
comparisons of the same argument) read the same way, so "not one of these
values" is written as a handful of single comparisons (see
:func:`_not_one_of` and :func:`_personality_rules`).

Only syscalls whose names libseccomp resolves on the native architecture go
into the BPF program; the others do not exist there. Syscalls of any other
ABI (i386 ``int 0x80`` or x32 numbers on x86_64) fail with ``EPERM``: they
would otherwise bypass every rule.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HORIZON",
    "REVIEWED_UP_TO",
    "RULES",
    "UNIFIED_NUMBERS",
    "Cmp",
    "Rule",
    "SeccompUnavailable",
    "bpf_fd",
    "build_filter",
    "compile_bpf",
    "container_profile",
    "docker_profile",
    "docker_security_opt",
    "refused_syscalls",
]


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its ``pyseccomp`` binding) is missing: no sandbox starts
    without its filter."""


@dataclass(frozen=True)
class Cmp:
    """One comparison of syscall argument ``index`` (0-based) with ``value``.

    ``op`` is one of ``EQ NE LT LE GT GE MASKED_EQ`` (unsigned, 64 bit). For
    ``MASKED_EQ`` the test is ``arg & mask == value``.
    """

    index: int
    op: str
    value: int
    mask: int = 0


@dataclass(frozen=True)
class Rule:
    """Refuse ``syscall`` with ``errno`` when every comparison in ``args`` holds
    (always, when there is none)."""

    syscall: str
    why: str
    args: tuple[Cmp, ...] = ()
    errno: int = errno.EPERM

    def __post_init__(self) -> None:
        indexes = [c.index for c in self.args]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"seccomp rule for {self.syscall}: two comparisons of one argument {indexes}")


def _deny(why: str, *names: str) -> list[Rule]:
    return [Rule(name, why) for name in names]


def _not_one_of(syscall: str, index: int, allowed: list[int], why: str) -> list[Rule]:
    """Refuse ``syscall`` unless argument ``index`` is exactly one of ``allowed``
    (small non-negative integers): below the smallest, each gap value, above
    the largest. Compared over all 64 bits, so high garbage bits that the
    kernel would truncate away (``int`` arguments) are refused too."""
    allowed = sorted(set(allowed))
    rules = []
    if allowed[0] > 0:
        rules.append(Rule(syscall, why, (Cmp(index, "LT", allowed[0]),)))
    for value in range(allowed[0], allowed[-1]):
        if value not in allowed:
            rules.append(Rule(syscall, why, (Cmp(index, "EQ", value),)))
    rules.append(Rule(syscall, why, (Cmp(index, "GT", allowed[-1]),)))
    return rules


#: personality(2) values a process may set: PER_LINUX (0), PER_LINUX32 (0x8,
#: ``linux32``), UNAME26 (0x20000) and both; 0xffffffff only queries. The same
#: set Docker's default profile allows. Refused: ADDR_NO_RANDOMIZE (turns ASLR
#: off for what the process execs), READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...
PERSONALITY_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
_PERSONALITY_FREE_BITS = (3, 17)  # the bits the allowed values may set


def _personality_rules() -> list[Rule]:
    """Refuse personality(x) for every x not in :data:`PERSONALITY_ALLOWED`.

    x is refused iff it has bits above 31, or (within 32 bits) it is not all
    ones and sets a bit outside {3, 17}. Any such x has, cyclically, a set bit
    i followed by a clear bit i+1 at the end of a run of set bits that holds a
    bit outside {3, 17}: one masked comparison per i covers it (two bits when i
    is not in {3, 17}; three, requiring i-1 set as well, when it is).
    """
    why = "personality: only the default persona, linux32, uname26 and the query"
    rules = [Rule("personality", why, (Cmp(0, "GT", 0xFFFFFFFF),))]
    for i in range(32):
        nxt = 1 << ((i + 1) % 32)
        if i in _PERSONALITY_FREE_BITS:
            prev = 1 << (i - 1)
            mask, value = prev | (1 << i) | nxt, prev | (1 << i)
        else:
            mask, value = (1 << i) | nxt, 1 << i
        rules.append(Rule("personality", why, (Cmp(0, "MASKED_EQ", value, mask),)))
    return rules


#: Address families a socket may have: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK.
SOCKET_FAMILIES_ALLOWED = [1, 2, 10, 16]

#: clone(2) flags that make a namespace (CLONE_NEWTIME, 0x80, is only honoured by clone3).
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

#: ioctl requests refused on any fd: TIOCSTI pushes input into a terminal,
#: TIOCLINUX can read the virtual console. ``cmd`` is an ``unsigned int`` in the
#: kernel: compare its low 32 bits only, so high garbage bits do not slip past.
IOCTLS_REFUSED = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}

#: renameat2's flag that leaves a whiteout, a character device 0:0, at the old
#: name (unprivileged since Linux 5.8): a device node on the host without mknod.
RENAME_WHITEOUT = 0x4

#: The mode bits that make an executable run as its file's owner or group. A
#: workspace file is owned on the host by the sandbox's host uid (the user's, or
#: the uid a root kernel hands its sandboxes): with S_ISUID any local account
#: that reaches the folder would run as that uid. S_ISVTX is harmless.
SET_ID_BITS = {"S_ISUID": 0o4000, "S_ISGID": 0o2000}

#: Syscalls that take a file mode, and the index of that argument. mknod and
#: mknodat are refused outright; open and openat are in :data:`OPEN_MODE_ARGS`.
MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1, "mkdir": 1, "mkdirat": 2}

#: open and openat: (flags index, mode index). The kernel reads the mode only
#: when the flags create a file, so only then is it compared: a raw call without
#: O_CREAT may leave garbage in the mode register.
OPEN_MODE_ARGS = {"open": (1, 2), "openat": (2, 3)}

#: The flag bits with which open creates a file (the same on x86_64 and
#: aarch64): O_CREAT, and __O_TMPFILE, the bit O_TMPFILE adds to O_DIRECTORY.
CREATING_OPEN_FLAGS = {"O_CREAT": 0o100, "O_TMPFILE": 0o20000000}


def _has_bit(index: int, bit: int) -> Cmp:
    return Cmp(index, "MASKED_EQ", bit, bit)


def _set_id_mode_rules() -> list[Rule]:
    """Refuse every call that would give a file or directory S_ISUID or S_ISGID.

    One rule per (syscall, bit): "either bit" is an OR, which only separate
    rules express. Only the two low bits are compared, so garbage in the
    high bits (the kernel truncates the mode to 16) changes nothing.
    openat2 reads its mode from a struct: see the openat2 rule.
    """
    rules = []
    for bit_name, bit in SET_ID_BITS.items():
        why = f"{bit_name}: a set-id file in the workspace runs as the sandbox's host uid for anyone"
        rules += [Rule(name, why, (_has_bit(index, bit),)) for name, index in MODE_ARG.items()]
        for name, (flags_index, mode_index) in OPEN_MODE_ARGS.items():
            rules += [
                Rule(name, why, (_has_bit(flags_index, flag), _has_bit(mode_index, bit)))
                for flag in CREATING_OPEN_FLAGS.values()
            ]
    return rules


RULES: tuple[Rule, ...] = tuple(
    # --- syscalls that cross namespaces or widen the kernel's attack surface
    _deny(
        "ptrace and friends read or write other processes' memory",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "process_madvise",
        "pidfd_getfd",
        "kcmp",
    )
    + _deny(
        "bpf, perf and userfaultfd are kernel attack surface, not namespaced", "bpf", "perf_event_open", "userfaultfd"
    )
    + _deny("the kernel keyrings are not namespaced", "keyctl", "add_key", "request_key")
    + _deny(
        "io_uring bypasses syscall filtering and is kernel attack surface",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
    )
    + _deny("kexec", "kexec_load", "kexec_file_load")
    + _deny(
        "file handles open files by inode, outside the mounts (CVE-2014-3519 'shocker')",
        "open_by_handle_at",
        "name_to_handle_at",
    )
    + _deny(
        "mounts: the sandbox's file system view is fixed",
        "mount",
        "umount",
        "umount2",
        "pivot_root",
        "chroot",
        "move_mount",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "open_tree",
        "open_tree_attr",
        "mount_setattr",
    )
    + _deny("no new namespaces, no joining others", "unshare", "setns")
    + [
        Rule("clone", f"clone with {name}: no new namespaces", (Cmp(0, "MASKED_EQ", flag, flag),))
        for name, flag in CLONE_NAMESPACE_FLAGS.items()
    ]
    + [
        Rule(
            "clone3",
            "clone3's flags sit in memory a filter cannot read: ENOSYS makes libc use clone",
            errno=errno.ENOSYS,
        )
    ]
    + _not_one_of(
        "socket",
        0,
        SOCKET_FAMILIES_ALLOWED,
        "socket families other than unix, inet, inet6, netlink (AF_VSOCK is not namespaced)",
    )
    + _not_one_of("socketpair", 0, SOCKET_FAMILIES_ALLOWED, "socketpair families other than unix, inet, inet6, netlink")
    + [
        Rule("ioctl", f"ioctl {name}", (Cmp(1, "MASKED_EQ", value, 0xFFFFFFFF),))
        for name, value in IOCTLS_REFUSED.items()
    ]
    + _personality_rules()
    # --- nodes a host program could follow later (class 3)
    + _deny(
        "symlinks, FIFOs, device and socket nodes planted for a host program to follow",
        "symlink",
        "symlinkat",
        "mknod",
        "mknodat",
    )
    + [
        Rule(
            "renameat2",
            "RENAME_WHITEOUT leaves a character device 0:0 at the old name",
            (_has_bit(4, RENAME_WHITEOUT),),
        )
    ]
    # --- set-uid and set-gid files (a host account would run as the sandbox's uid)
    + _set_id_mode_rules()
    + [
        Rule(
            "openat2",
            "openat2's mode sits in memory a filter cannot read: ENOSYS, as before Linux 5.6, so callers use openat",
            errno=errno.ENOSYS,
        )
    ]
    # --- what Docker's default profile refuses besides: capability-gated anyway
    # (no capabilities in any sandbox), refused here as a second layer
    + _deny(
        "administration calls (Docker default profile parity)",
        "acct",
        "reboot",
        "swapon",
        "swapoff",
        "init_module",
        "finit_module",
        "delete_module",
        "create_module",
        "get_kernel_syms",
        "query_module",
        "iopl",
        "ioperm",
        "settimeofday",
        "stime",
        "clock_settime",
        "clock_adjtime",
        "quotactl",
        "quotactl_fd",
        "nfsservctl",
        "lookup_dcookie",
        "syslog",
        "uselib",
        "ustat",
        "sysfs",
        "_sysctl",
        "vm86",
        "vm86old",
        "fanotify_init",
    )
)


#: Syscalls of the unified table (x86_64 and aarch64 number every syscall
#: from 424 on alike) newer than some libseccomp releases: 2.5.4 (Debian 12)
#: names none of these, and a rule whose syscall it cannot name was skipped,
#: so ``open_tree_attr`` reached the kernel. Used only when libseccomp cannot
#: resolve the name, on those two architectures.
UNIFIED_NUMBERS = {
    "statmount": 457,
    "listmount": 458,
    "lsm_get_self_attr": 459,
    "lsm_set_self_attr": 460,
    "lsm_list_modules": 461,
    "mseal": 462,
    "setxattrat": 463,
    "getxattrat": 464,
    "listxattrat": 465,
    "removexattrat": 466,
    "open_tree_attr": 467,
    "file_getattr": 468,
    "file_setattr": 469,
}
#: the highest syscall number :data:`RULES` were reviewed against (Linux 6.17's
#: ``file_setattr``). Numbers above it, up to :data:`HORIZON`, get ``ENOSYS``
#: in the bwrap sandbox: a newer kernel's interfaces (a new mount call, a new
#: way around a namespace) stay out until reviewed, and libc treats them as a
#: kernel that is older, as it does for ``clone3``. A deny list alone allowed
#: every new interface until it was added here.
REVIEWED_UP_TO = 469
HORIZON = 1023
_UNIFIED_ARCHES = ("x86_64", "aarch64")


def refused_syscalls() -> list[str]:
    """Every syscall name the table mentions, in table order."""
    return list(dict.fromkeys(rule.syscall for rule in RULES))


# ----------------------------------------------------------------------- BPF


def _load_pyseccomp() -> Any:
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        raise SeccompUnavailable(
            f"cannot build the sandbox's seccomp filter: {exc}. Install libseccomp "
            "(Debian/Ubuntu package 'libseccomp2') and the Python package 'pyseccomp'"
        ) from exc
    return pyseccomp


@functools.lru_cache(maxsize=1)
def compile_bpf() -> bytes:
    """The classic-BPF program for the native architecture (cached per process).

    Raises :class:`SeccompUnavailable` when libseccomp cannot be loaded: a
    sandbox never starts without its filter.
    """
    with tempfile.TemporaryFile() as out:
        build_filter().export_bpf(out)
        out.seek(0)
        return out.read()


def build_filter() -> Any:
    """libseccomp's filter of :data:`RULES` for the native architecture (its
    ``export_pfc`` shows what the program does, rule by rule)."""
    sc = _load_pyseccomp()
    ops = {"EQ": sc.EQ, "NE": sc.NE, "LT": sc.LT, "LE": sc.LE, "GT": sc.GT, "GE": sc.GE, "MASKED_EQ": sc.MASKED_EQ}
    flt = sc.SyscallFilter(sc.ALLOW)
    # any other ABI (i386 int 0x80, x32) would bypass the rules: refuse it all
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.EPERM))
    try:
        flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # binary tree: fewer checks per syscall
    except OSError:
        pass  # libseccomp < 2.5: linear, still correct
    unified = _native_arch_name(sc) in _UNIFIED_ARCHES
    for rule in RULES:
        number = sc.resolve_syscall(sc.Arch.NATIVE, rule.syscall)
        if number < 0 and unified:
            number = UNIFIED_NUMBERS.get(rule.syscall, -1)  # newer than this libseccomp
        if number < 0:
            continue  # not a syscall of this architecture
        args = [
            sc.Arg(c.index, ops[c.op], c.mask, c.value) if c.op == "MASKED_EQ" else sc.Arg(c.index, ops[c.op], c.value)
            for c in rule.args
        ]
        flt.add_rule(sc.ERRNO(rule.errno), number, *args)
    if unified:
        for number in range(REVIEWED_UP_TO + 1, HORIZON + 1):
            flt.add_rule(sc.ERRNO(errno.ENOSYS), number)
    return flt


def _native_arch_name(sc: Any) -> str:
    """``x86_64`` or ``aarch64`` when the native architecture is one of them, else ""."""
    native = sc.system_arch()
    return next((name.lower() for name in ("X86_64", "AARCH64") if getattr(sc.Arch, name, None) == native), "")


def bpf_fd() -> int:
    """A readable fd holding the compiled program, for ``bwrap --seccomp FD``.

    A pipe whose write end is already closed (bwrap reads to EOF). The caller
    passes it with ``pass_fds`` and closes it once bwrap has started.
    """
    program = compile_bpf()
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)  # a few KB: always fits the pipe buffer
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return read_fd


# -------------------------------------------------------------------- Docker


def docker_profile(rules: tuple[Rule, ...] = RULES) -> dict[str, Any]:
    """The same rules as a Docker seccomp profile.

    ``defaultAction`` is ALLOW: a profile passed to Docker *replaces* Docker's
    default allow-list, and re-creating that list here would be a second,
    drifting copy. What Docker's default refuses that matters (namespaces,
    mounts, keyrings, ptrace, bpf, perf, personality, AF_VSOCK, ...) is in
    :data:`RULES`; the rest needs capabilities that every container drops
    (``cap_drop=ALL``, ``no-new-privileges``). ``architectures`` is left empty:
    runc then builds the filter for the daemon's native ABI only, so other ABIs
    hit the bad-architecture action.
    """
    entries: list[dict[str, Any]] = []
    index: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rule in rules:
        args = [
            {"index": c.index, "value": c.mask, "valueTwo": c.value, "op": "SCMP_CMP_MASKED_EQ"}
            if c.op == "MASKED_EQ"
            else {"index": c.index, "value": c.value, "valueTwo": 0, "op": f"SCMP_CMP_{c.op}"}
            for c in rule.args
        ]
        key = (rule.errno, json.dumps(args, sort_keys=True))
        if key in index:
            index[key]["names"].append(rule.syscall)
            continue
        entry = {"names": [rule.syscall], "action": "SCMP_ACT_ERRNO", "errnoRet": rule.errno, "args": args}
        index[key] = entry
        entries.append(entry)
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [], "syscalls": entries}


#: What bwrap (and pasta, for the open network) must be able to do inside a
#: container: make namespaces (clone's namespace flags, unshare), join the ones
#: it made (setns), build the sandbox's root (mount, umount2, pivot_root). Plus
#: what the Jupyter server and pip do in a container that a sandbox may not
#: (symlinks, FIFOs). The sandbox's own filter refuses all of them again inside.
BWRAP_HOST_NEEDS = frozenset(
    {"clone", "unshare", "setns", "mount", "umount2", "pivot_root", "symlink", "symlinkat", "mknod", "mknodat"}
)


def container_profile() -> dict[str, Any]:
    """The seccomp profile for the container a kernel runs in, so that its bwrap
    sandboxes can start (``docker run --security-opt seccomp=<this file>``;
    ``sandbox-kernel container-profile`` prints it, docker/seccomp-bwrap.json is a
    copy).

    Docker's default profile lets a process without CAP_SYS_ADMIN make no
    namespace and no mount, so bwrap cannot start under it. This profile refuses
    what the sandbox's filter refuses, except :data:`BWRAP_HOST_NEEDS`: the
    kernel process may make user namespaces, cells may not. mknod stays
    capability-gated for devices (every container drops CAP_MKNOD)."""
    return docker_profile(tuple(rule for rule in RULES if rule.syscall not in BWRAP_HOST_NEEDS))


@functools.lru_cache(maxsize=1)
def docker_security_opt() -> str:
    """``seccomp=<profile JSON>``, the form the Docker API takes in ``SecurityOpt``."""
    return "seccomp=" + json.dumps(docker_profile(), separators=(",", ":"))
