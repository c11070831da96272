"""The seccomp filter of every bwrap sandbox, attacked from inside real cells.

Each attack runs as cell code in a real kernel (bwrap backend) and tries a
refused call several ways: the Python API, libc through ctypes, and the raw
``syscall()`` number (resolved on the host with libseccomp, so the test runs
on x86_64 and aarch64), so a libc wrapper trick cannot bypass the filter.
Refusals must be ``EPERM`` (``ENOSYS`` for clone3), never a kill: the cell
itself must finish and report.

Also: the table's semantics (personality, socket families) are checked
against a model, the Docker profile is checked to carry the very same rules,
and a jupyter_server save next to a planted ``.~nb.ipynb`` stays inside.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import stat
import tempfile
import textwrap
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle

from sandbox_kernel.sandbox import seccomp

pyseccomp = pytest.importorskip("pyseccomp")


def nr(name: str) -> int:
    """The native syscall number of ``name`` (-1 when it does not exist here);
    the unified table's number when this libseccomp is too old to name it."""
    number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    if number < 0 and platform.machine() in ("x86_64", "aarch64"):
        number = seccomp.UNIFIED_NUMBERS.get(name, -1)
    return number if number >= 0 else -1


#: Prepended to the attack cells: ``sc(nr, *args) -> (result, errno)`` through libc's syscall().
PRELUDE = textwrap.dedent(
    """
    import ctypes, errno, os, socket
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
    def sc(number, *args):
        ctypes.set_errno(0)
        res = _libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        return res, ctypes.get_errno()
    def refused(number, *args):
        res, err = sc(number, *args)
        return res == -1 and err == errno.EPERM
    def attempt(fn):
        try:
            fn()
            return 'done'
        except OSError as exc:
            return errno.errorcode.get(exc.errno)
    """
)


def run_json(kernel: SandboxKernelHandle, body: str) -> dict:
    """Run ``body`` (which fills the dict ``out``) in a cell; return ``out``."""
    code = PRELUDE + "out = {}\n" + textwrap.dedent(body) + "\nimport json as _j\nprint('OUT=' + _j.dumps(out))"
    run = kernel.run(code, timeout=120)
    assert run.status == "ok", (run.reply, run.stderr)
    lines = [line for line in run.stdout.splitlines() if line.startswith("OUT=")]
    assert lines, run.stdout
    return json.loads(lines[-1][4:])


# ------------------------------------------------------------ the table itself


def model_refuses(syscall: str, args: list[int]) -> int | None:
    """Evaluate :data:`seccomp.RULES` in Python: the errno refusing the call, or None."""
    ops = {
        "EQ": lambda a, c: a == c.value,
        "NE": lambda a, c: a != c.value,
        "LT": lambda a, c: a < c.value,
        "LE": lambda a, c: a <= c.value,
        "GT": lambda a, c: a > c.value,
        "GE": lambda a, c: a >= c.value,
        "MASKED_EQ": lambda a, c: a & c.mask == c.value,
    }
    for rule in seccomp.RULES:
        if rule.syscall == syscall and all(ops[c.op](args[c.index], c) for c in rule.args):
            return rule.errno
    return None


def test_personality_rules_refuse_exactly_the_complement_of_the_allowed_set() -> None:
    import random

    rng = random.Random(7)
    samples = set(seccomp.PERSONALITY_ALLOWED)
    samples |= (
        {1 << b for b in range(64)} | {(1 << b) | 0x8 for b in range(64)} | {(1 << b) | 0x20008 for b in range(64)}
    )
    samples |= {0xFFFFFFFF ^ (1 << b) for b in range(32)} | {
        0x1FFFFFFFF,
        0xFFFFFFFF_FFFFFFFF,
        0x0040000,
        0x0400000,
        0x0100000,
    }
    samples |= {rng.getrandbits(32) for _ in range(5000)} | {rng.getrandbits(64) for _ in range(500)}
    for value in samples:
        expected = None if value in seccomp.PERSONALITY_ALLOWED else errno.EPERM
        assert model_refuses("personality", [value]) == expected, hex(value)


def test_socket_rules_refuse_every_family_but_unix_inet_inet6_netlink() -> None:
    for family in [*range(64), 0x100000028, 0x100000001, 2**64 - 1]:
        expected = None if family in (1, 2, 10, 16) else errno.EPERM
        assert model_refuses("socket", [family, 1, 0]) == expected, family
        assert model_refuses("socketpair", [family, 1, 0, 0]) == expected, family


def test_set_id_rules_refuse_exactly_the_set_id_bits_of_a_mode() -> None:
    """S_ISUID or S_ISGID in the mode argument (high garbage bits or not) is
    refused; permission and sticky bits are not. open and openat only when the
    flags create a file: without O_CREAT/O_TMPFILE the kernel ignores the mode."""
    create, tmpfile, rdonly = 0o100 | 0o1, 0o20200000 | 0o2, 0
    where = {"chmod": (1, 2), "fchmod": (1, 2), "fchmodat": (2, 4), "fchmodat2": (2, 4), "creat": (1, 2)}
    where |= {"mkdir": (1, 2), "mkdirat": (2, 3)}
    for mode in (0o4755, 0o2755, 0o6777, 0o2000, 0x10000 | 0o4000, 0xFFFFFFFF_FFFFFFFF):
        for syscall, (index, nargs) in where.items():
            args = [0] * nargs
            args[index] = mode
            assert model_refuses(syscall, args) == errno.EPERM, (syscall, oct(mode))
        for flags in (create, tmpfile):
            assert model_refuses("openat", [0, 0, flags, mode]) == errno.EPERM, (oct(flags), oct(mode))
            assert model_refuses("open", [0, flags, mode]) == errno.EPERM, (oct(flags), oct(mode))
        assert model_refuses("openat", [0, 0, rdonly, mode]) is None
    for mode in (0o755, 0o644, 0o1777, 0o777, 0x10000 | 0o755):
        for syscall, (index, nargs) in where.items():
            args = [0] * nargs
            args[index] = mode
            assert model_refuses(syscall, args) is None, (syscall, oct(mode))
        assert model_refuses("openat", [0, 0, create, mode]) is None
    assert model_refuses("openat2", [0, 0, 0, 24]) == errno.ENOSYS


def test_renameat2_rules_refuse_only_the_whiteout_flag() -> None:
    for flags in (4, 4 | 1, 4 | 2, (1 << 32) | 4, 0xFFFFFFFF):
        assert model_refuses("renameat2", [0, 0, 0, 0, flags]) == errno.EPERM, hex(flags)
    for flags in (0, 1, 2, 1 << 32):  # RENAME_NOREPLACE, RENAME_EXCHANGE
        assert model_refuses("renameat2", [0, 0, 0, 0, flags]) is None, hex(flags)


def test_docker_profile_is_generated_from_the_same_rules() -> None:
    profile = seccomp.docker_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and profile["architectures"] == []
    rebuilt = []
    for entry in profile["syscalls"]:
        assert entry["action"] == "SCMP_ACT_ERRNO"
        for name in entry["names"]:
            rebuilt.append((name, entry["errnoRet"], json.dumps(entry["args"], sort_keys=True)))
    expected = []
    for rule in seccomp.RULES:
        args = [
            {
                "index": c.index,
                "op": f"SCMP_CMP_{c.op}",
                "value": c.mask if c.op == "MASKED_EQ" else c.value,
                "valueTwo": c.value if c.op == "MASKED_EQ" else 0,
            }
            for c in rule.args
        ]
        expected.append((rule.syscall, rule.errno, json.dumps(args, sort_keys=True)))
    assert sorted(rebuilt) == sorted(expected)
    assert seccomp.docker_security_opt() == "seccomp=" + json.dumps(profile, separators=(",", ":"))


def test_rule_with_two_comparisons_of_one_argument_is_refused() -> None:
    with pytest.raises(ValueError, match="two comparisons of one argument"):
        seccomp.Rule("personality", "x", (seccomp.Cmp(0, "GT", 1), seccomp.Cmp(0, "LT", 5)))


def test_compiled_program_is_cached_and_passed_as_a_readable_fd() -> None:
    program = seccomp.compile_bpf()
    assert program is seccomp.compile_bpf()
    assert len(program) % 8 == 0 and len(program) > 8 * 50  # struct sock_filter entries
    fd = seccomp.bpf_fd()
    try:
        assert os.read(fd, len(program) + 1) == program
    finally:
        os.close(fd)


def test_syscalls_past_the_reviewed_table_get_enosys_and_newer_names_a_number() -> None:
    """A deny list allowed every interface a newer kernel added until it was
    named here, and a rule whose syscall this libseccomp could not name
    (``open_tree_attr``: 2.5.4 names nothing past 456) was skipped."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the unified syscall table is x86_64's and aarch64's")
    with tempfile.TemporaryFile() as out:
        seccomp.build_filter().export_pfc(out)
        out.seek(0)
        text = out.read().decode()
    refused = dict(re.findall(r"if \(\$syscall == (\d+)\)\n\s+action ERRNO\((\d+)\);", text))
    assert refused[str(seccomp.UNIFIED_NUMBERS["open_tree_attr"])] == str(errno.EPERM)
    for number in (seccomp.REVIEWED_UP_TO + 1, 500, seccomp.HORIZON):
        assert refused[str(number)] == str(errno.ENOSYS), number
    assert str(seccomp.REVIEWED_UP_TO) not in refused  # file_setattr: reviewed, allowed
    assert max(seccomp.UNIFIED_NUMBERS.values()) == seccomp.REVIEWED_UP_TO


# --------------------------------------------------------- in place, in a cell


def test_cell_runs_under_a_seccomp_filter(kernel: SandboxKernelHandle) -> None:
    out = run_json(
        kernel,
        """
        status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)
        out['mode'] = status['Seccomp'].strip()
        out['filters'] = int(status.get('Seccomp_filters', '0'))
    """,
    )
    assert out["mode"] == "2" and out["filters"] >= 1


def test_socket_families_that_cross_namespaces_are_refused(kernel: SandboxKernelHandle) -> None:
    out = run_json(
        kernel,
        f"""
        def try_family(family, kind=socket.SOCK_STREAM):
            try:
                socket.socket(family, kind).close()
                return 'opened'
            except PermissionError:
                return 'EPERM'
            except OSError as exc:
                return errno.errorcode.get(exc.errno, str(exc.errno))
        out['vsock'] = try_family(40)
        out['vsock_dgram'] = try_family(40, socket.SOCK_DGRAM)
        out['packet'] = try_family(17, socket.SOCK_RAW)
        out['bluetooth'] = try_family(31, socket.SOCK_SEQPACKET)
        out['alg'] = try_family(38, socket.SOCK_SEQPACKET)
        out['key'] = try_family(15, socket.SOCK_RAW)
        out['tipc'] = try_family(30, socket.SOCK_RDM)
        out['xdp'] = try_family(44, socket.SOCK_RAW)
        # raw syscalls: AF_VSOCK with high garbage bits the kernel truncates away
        out['raw_vsock'] = refused({nr("socket")}, 40, 1, 0)
        out['raw_vsock_high'] = refused({nr("socket")}, 0x100000028, 1, 0)
        pair = (ctypes.c_int * 2)()
        out['socketpair_vsock'] = refused({nr("socketpair")}, 40, 1, 0, pair)
        # what normal work needs still opens
        out['allowed'] = [try_family(f, k) for f, k in ((1, socket.SOCK_STREAM), (2, socket.SOCK_STREAM),
                          (10, socket.SOCK_DGRAM), (16, socket.SOCK_RAW))]
        a, b = socket.socketpair(); a.close(); b.close()
    """,
    )
    for name in ("vsock", "vsock_dgram", "packet", "bluetooth", "alg", "key", "tipc", "xdp"):
        assert out[name] == "EPERM", (name, out)
    assert out["raw_vsock"] and out["raw_vsock_high"] and out["socketpair_vsock"], out
    assert out["allowed"] == ["opened"] * 4, out


def test_links_fifos_and_device_nodes_cannot_be_planted(kernel: SandboxKernelHandle, tmp_path: Path) -> None:
    target = tmp_path / "host-secret.txt"
    target.write_text("host")
    AT_FDCWD = -100
    out = run_json(
        kernel,
        f"""
        import stat
        os.chdir('/workspace')
        attempts = {{
            'os.symlink': lambda: os.symlink({str(target)!r}, 'plant-symlink'),
            'os.symlink_tmp': lambda: os.symlink('/etc/passwd', '/tmp/plant-symlink'),
            'os.mkfifo': lambda: os.mkfifo('plant-fifo'),
            'os.mknod_fifo': lambda: os.mknod('plant-mknod-fifo', 0o600 | stat.S_IFIFO),
            'os.mknod_sock': lambda: os.mknod('plant-mknod-sock', 0o600 | stat.S_IFSOCK),
            'os.mknod_chr': lambda: os.mknod('plant-mknod-chr', 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
            'os.mknod_whiteout': lambda: os.mknod('plant-whiteout', stat.S_IFCHR, 0),
        }}
        for name, attempt in attempts.items():
            try:
                attempt()
                out[name] = 'created'
            except PermissionError:
                out[name] = 'EPERM'
            except OSError as exc:
                out[name] = errno.errorcode.get(exc.errno)
        # straight to the kernel, bypassing Python's and libc's wrappers
        out['raw_symlinkat'] = refused({nr("symlinkat")}, {str(target).encode()!r}, {AT_FDCWD}, b'plant-raw-symlinkat')
        out['raw_symlinkat_dirfd'] = refused({nr("symlinkat")}, b'/etc/passwd', os.open('/workspace', os.O_RDONLY), b'plant-raw-dirfd')
        out['raw_mknodat_fifo'] = refused({nr("mknodat")}, {AT_FDCWD}, b'plant-raw-fifo', stat.S_IFIFO | 0o600, 0)
        out['raw_mknodat_blk'] = refused({nr("mknodat")}, {AT_FDCWD}, b'plant-raw-blk', stat.S_IFBLK | 0o600, os.makedev(8, 0))
        if {nr("symlink")} >= 0:  # x86_64 still has the old calls
            out['raw_symlink'] = refused({nr("symlink")}, b'/etc/passwd', b'plant-raw-symlink')
            out['raw_mknod'] = refused({nr("mknod")}, b'plant-raw-mknod', stat.S_IFIFO | 0o600, 0)
        out['listing'] = sorted(os.listdir('/workspace'))
    """,
    )
    for name in (
        "os.symlink",
        "os.symlink_tmp",
        "os.mkfifo",
        "os.mknod_fifo",
        "os.mknod_sock",
        "os.mknod_chr",
        "os.mknod_whiteout",
    ):
        assert out[name] == "EPERM", (name, out)
    raw = [k for k in out if k.startswith("raw_")]
    assert len(raw) >= 4 and all(out[k] is True for k in raw), out
    assert not [n for n in out["listing"] if n.startswith("plant")], out
    planted = [p for p in kernel.workspace.iterdir() if p.name.startswith("plant")]
    assert planted == [] and target.read_text() == "host"


def test_hard_links_only_alias_files_of_the_workspace_mount(kernel: SandboxKernelHandle) -> None:
    """Known limit, kept on purpose: link(2) stays allowed (glibc's sem_open, hence
    multiprocessing's locks, need it). It can only alias an inode of the same
    mount that the sandbox may already write, never a file outside the workspace."""
    out = run_json(
        kernel,
        """
        results = {}
        for source in ('/etc/passwd', '/usr/bin/env', '/tmp/own-file', '/proc/self/status'):
            if source == '/tmp/own-file':
                open(source, 'w').close()
            try:
                os.link(source, '/workspace/hardlink-' + os.path.basename(source))
                results[source] = 'linked'
            except OSError as exc:
                results[source] = errno.errorcode.get(exc.errno)
        out['results'] = results
    """,
    )
    assert "linked" not in out["results"].values(), out
    assert not list(kernel.workspace.glob("hardlink-*"))


def host_device_nodes(folder: Path) -> list[str]:
    """Everything under ``folder`` that the host sees as a character or block device."""
    found = []
    for path in [folder, *folder.rglob("*")]:
        mode = os.lstat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            found.append(str(path.relative_to(folder)))
    return found


def host_set_id_files(folder: Path) -> dict[str, str]:
    """Everything under ``folder`` that carries S_ISUID or S_ISGID on the host, with its mode."""
    return {
        str(path.relative_to(folder)): oct(os.lstat(path).st_mode)
        for path in folder.rglob("*")
        if os.lstat(path).st_mode & (stat.S_ISUID | stat.S_ISGID)
    }


def test_rename_whiteout_cannot_plant_a_device_node(kernel: SandboxKernelHandle) -> None:
    """renameat2(RENAME_WHITEOUT), unprivileged since Linux 5.8, leaves a
    character device 0:0 at the old name: a device node without mknod, which a
    plain rename then moves to ``.~nb.ipynb`` or a checkpoint, where
    jupyter_server's next save fails (ENXIO). Refused with EPERM through libc
    and the raw syscall, whatever else is in the flags; the host sees no node."""
    sub = kernel.workspace / "whiteout"
    sub.mkdir()
    out = run_json(
        kernel,
        f"""
        import stat
        os.chdir('/workspace/whiteout')
        os.makedirs('.ipynb_checkpoints', exist_ok=True)
        RENAMEAT2 = {nr("renameat2")}
        def renameat2(how, old, new, flags):
            if how == 'libc':
                ctypes.set_errno(0)
                return [_libc.renameat2(-100, old, -100, new, ctypes.c_uint(flags)), ctypes.get_errno()]
            return list(sc(RENAMEAT2, -100, old, -100, new, flags))
        def whiteout(how, target, flags):
            open('src', 'w').close()
            result = renameat2(how, b'src', b'dst', flags)
            planted = stat.S_ISCHR(os.lstat('src').st_mode)
            if planted:
                os.rename('src', target)  # the device moves to a name a host save uses
            for name in ('src', 'dst'):
                if os.path.lexists(name):
                    os.unlink(name)
            return result + [planted]
        out['libc'] = whiteout('libc', '.~nb.ipynb', 4)
        out['raw'] = whiteout('raw', '.ipynb_checkpoints/nb-checkpoint.ipynb', 4)
        out['raw_noreplace'] = whiteout('raw', 'other.ipynb', 4 | 1)
        out['raw_high_bits'] = whiteout('raw', 'x.ipynb', (1 << 32) | 4)
        # renameat2's other flags, and plain renames, stay allowed
        for name in ('a', 'b'):
            open(name, 'w').write(name)
        out['noreplace'] = renameat2('raw', b'a', b'c', 1)
        out['exchange'] = renameat2('raw', b'c', b'b', 2)
        os.rename('b', 'd')
        out['contents'] = [open(name).read() for name in ('c', 'd')]
    """,
    )
    for name in ("libc", "raw", "raw_noreplace", "raw_high_bits"):
        assert out[name] == [-1, errno.EPERM, False], (name, out)
    assert out["noreplace"] == [0, 0] and out["exchange"] == [0, 0], out
    assert out["contents"] == ["b", "a"], out
    assert host_device_nodes(kernel.workspace) == []


def test_set_id_files_cannot_be_made(kernel: SandboxKernelHandle) -> None:
    """A workspace file is owned on the host by the sandbox's host uid (the
    user's, or 65534 for a root kernel): with S_ISUID or S_ISGID any local
    account that reaches the folder runs it as that uid. Every way a cell gives
    a mode (chmod family, creating open, creat, mkdir; libc and raw) is refused
    when it carries those bits, openat2 (mode in memory) says ENOSYS, and the
    host sees no set-id entry afterwards."""
    O_CREAT, O_WRONLY, O_TMPFILE = os.O_CREAT, os.O_WRONLY, getattr(os, "O_TMPFILE", 0o20200000)
    raw = {
        "raw_chmod": (nr("chmod"), b"victim", 0o4755),
        "raw_fchmod": (nr("fchmod"), "FD", 0o2755),
        "raw_fchmodat": (nr("fchmodat"), -100, b"victim", 0o4755, 0),
        "raw_fchmodat_high_bits": (nr("fchmodat"), -100, b"victim", 0x10000 | 0o4755, 0),
        "raw_fchmodat2": (nr("fchmodat2"), -100, b"victim", 0o6755, 0),
        "raw_openat_creat": (nr("openat"), -100, b"raw-openat", O_CREAT | O_WRONLY, 0o4755),
        "raw_openat_tmpfile": (nr("openat"), -100, b".", O_TMPFILE | O_WRONLY, 0o2755),
        "raw_open_creat": (nr("open"), b"raw-open", O_CREAT | O_WRONLY, 0o4755),
        "raw_creat": (nr("creat"), b"raw-creat", 0o6755),
        "raw_mkdirat": (nr("mkdirat"), -100, b"raw-mkdirat", 0o2777),
        "raw_mkdir": (nr("mkdir"), b"raw-mkdir", 0o2777),
    }
    raw = {name: call for name, call in raw.items() if call[0] >= 0}  # open, creat, mkdir: not on aarch64
    assert len(raw) >= 7
    out = run_json(
        kernel,
        f"""
        import shutil, stat, subprocess
        os.makedirs('/workspace/setid', exist_ok=True)
        os.chdir('/workspace/setid')
        shutil.copy('/usr/bin/id', 'victim')
        fd = os.open('victim', os.O_RDONLY)
        out['os.chmod_6755'] = attempt(lambda: os.chmod('victim', 0o6755))
        out['os.chmod_4755'] = attempt(lambda: os.chmod('victim', 0o4755))
        out['os.chmod_2755'] = attempt(lambda: os.chmod('victim', 0o2755))
        out['os.fchmod_4755'] = attempt(lambda: os.fchmod(fd, 0o4755))
        out['os.open_creat_4755'] = attempt(lambda: os.close(os.open('new-suid', os.O_CREAT | os.O_WRONLY, 0o4755)))
        out['os.mkdir_2777'] = attempt(lambda: os.mkdir('sgid-dir', 0o2777))
        os.mkdir('plain-dir')
        out['os.chmod_dir_2775'] = attempt(lambda: os.chmod('plain-dir', 0o2775))
        out['chmod_u+s'] = subprocess.run(['chmod', 'u+s', 'victim'], capture_output=True).returncode
        out['chmod_g+s_dir'] = subprocess.run(['chmod', 'g+s', 'plain-dir'], capture_output=True).returncode
        for name, call in {raw!r}.items():
            call = [fd if arg == 'FD' else arg for arg in call]
            out[name] = list(sc(*call))
        how = (ctypes.c_uint64 * 3)({O_CREAT | O_WRONLY}, 0o4755, 0)  # struct open_how
        out['raw_openat2'] = list(sc({nr("openat2")}, -100, b'raw-openat2', how, 24))
        out['modes'] = {{n: oct(os.lstat(n).st_mode) for n in os.listdir('.')}}
    """,
    )
    refused = {name: value for name, value in out.items() if name != "modes"}
    for name in ("os.chmod_6755", "os.chmod_4755", "os.chmod_2755", "os.fchmod_4755"):
        assert refused.pop(name) == "EPERM", (name, out)
    for name in ("os.open_creat_4755", "os.mkdir_2777", "os.chmod_dir_2775"):
        assert refused.pop(name) == "EPERM", (name, out)
    assert refused.pop("chmod_u+s") != 0 and refused.pop("chmod_g+s_dir") != 0, out
    assert refused.pop("raw_openat2") == [-1, errno.ENOSYS], out
    for name, result in refused.items():
        assert result == [-1, errno.EPERM], (name, out)
    assert not [mode for mode in out["modes"].values() if int(mode, 8) & 0o6000], out
    assert host_set_id_files(kernel.workspace) == {}
    assert os.lstat(kernel.workspace / "setid" / "victim").st_mode & 0o7777 == 0o755


def test_copies_of_the_hosts_set_uid_programs_lose_the_bits(kernel: SandboxKernelHandle) -> None:
    """/usr is the host's, read-only, and holds set-uid programs (su, mount,
    passwd). Copying one with its mode (shutil.copy2, cp -p, install -m, tar -p,
    tarfile) must not leave a set-uid copy: the copy fails loudly (shutil,
    install, tar) or ends without the bits (cp, tarfile), never keeps them."""
    sources = [p for p in ("/usr/bin/su", "/usr/bin/mount", "/usr/bin/passwd") if os.stat(p).st_mode & stat.S_ISUID]
    if not sources:
        pytest.skip("no set-uid program in /usr/bin to copy")
    source = sources[0]
    out = run_json(
        kernel,
        f"""
        import shutil, subprocess, tarfile
        os.makedirs('/workspace/copies', exist_ok=True)
        os.chdir('/workspace/copies')
        source = {source!r}
        def run(*argv):
            done = subprocess.run(argv, capture_output=True, text=True)
            return [done.returncode, done.stderr.strip()[-200:]]
        out['shutil.copy2'] = attempt(lambda: shutil.copy2(source, 'copy2'))
        out['shutil.copy'] = attempt(lambda: shutil.copy(source, 'copy'))
        out['cp_p'] = run('cp', '-p', source, 'cp-p')
        out['cp_a'] = run('cp', '-a', source, 'cp-a')
        out['install_m'] = run('install', '-m', '4755', source, 'install-m')
        run('tar', '-cf', '/tmp/setuid.tar', '-C', os.path.dirname(source), os.path.basename(source))
        os.mkdir('tar-p')
        out['tar_xp'] = run('tar', '-xpf', '/tmp/setuid.tar', '-C', 'tar-p')
        extra = {{'filter': 'fully_trusted'}} if hasattr(tarfile, 'fully_trusted_filter') else {{}}
        with tarfile.open('/tmp/setuid.tar') as archive:
            out['tarfile'] = attempt(lambda: archive.extractall('tarfile', **extra))
    """,
    )
    # the mode is the last step: the copy stays, without its bits
    assert out["shutil.copy2"] == "EPERM" and out["shutil.copy"] == "EPERM", out
    for name in ("install_m", "tar_xp"):
        assert out[name][0] != 0 and "Operation not permitted" in out[name][1], (name, out)
    # cp -p/-a drop the bits themselves (they cannot keep the owner); tarfile
    # logs a failed chmod only at errorlevel 2: both end without the bits
    assert out["cp_p"][0] == 0 and out["cp_a"][0] == 0 and out["tarfile"] == "done", out
    assert host_set_id_files(kernel.workspace) == {}, out
    for name in ("copy2", "cp-p", "tar-p/" + os.path.basename(source), "tarfile/" + os.path.basename(source)):
        assert (kernel.workspace / "copies" / name).exists(), name


def test_namespace_and_process_calls_are_refused(kernel: SandboxKernelHandle) -> None:
    CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, SIGCHLD = 0x10000000, 0x40000000, 0x20000, 0x20000000, 17
    out = run_json(
        kernel,
        f"""
        out['unshare_user'] = sc({nr("unshare")}, {CLONE_NEWUSER})
        out['unshare_net'] = sc({nr("unshare")}, {CLONE_NEWNET})
        out['unshare_ns'] = sc({nr("unshare")}, {CLONE_NEWNS})
        out['libc_unshare'] = (_libc.unshare({CLONE_NEWUSER | CLONE_NEWNS}), ctypes.get_errno())
        ns = os.open('/proc/self/ns/net', os.O_RDONLY)
        out['setns'] = sc({nr("setns")}, ns, 0)
        out['clone_newuser'] = sc({nr("clone")}, {CLONE_NEWUSER | SIGCHLD}, 0, 0, 0, 0)
        out['clone_newpid'] = sc({nr("clone")}, {CLONE_NEWPID | SIGCHLD}, 0, 0, 0, 0)
        out['clone_newnet_high'] = sc({nr("clone")}, {CLONE_NEWNET | SIGCHLD | (1 << 40)}, 0, 0, 0, 0)
        out['clone3'] = sc({nr("clone3")}, 0, 0)
        out['ptrace_traceme'] = sc({nr("ptrace")}, 0, 0, 0, 0)
        out['ptrace_attach_parent'] = sc({nr("ptrace")}, 16, os.getppid(), 0, 0)
        buf = ctypes.create_string_buffer(8)
        iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
        out['process_vm_readv'] = sc({nr("process_vm_readv")}, os.getppid(), iov, 1, iov, 1, 0)
        out['process_vm_writev'] = sc({nr("process_vm_writev")}, os.getppid(), iov, 1, iov, 1, 0)
        out['mount'] = sc({nr("mount")}, b'none', b'/tmp', b'tmpfs', 0, 0)
        out['umount2'] = sc({nr("umount2")}, b'/tmp', 0)
        out['pivot_root'] = sc({nr("pivot_root")}, b'/tmp', b'/tmp')
        out['fsopen'] = sc({nr("fsopen")}, b'tmpfs', 0)
        out['open_tree'] = sc({nr("open_tree")}, -100, b'/tmp', 1)
        # newer than libseccomp 2.5.4; bad flags: the kernel itself answers EINVAL
        out['open_tree_attr'] = sc({nr("open_tree_attr")}, -100, b'/tmp', 0xFFFFFFFF, 0, 0)
        out['move_mount'] = sc({nr("move_mount")}, -100, b'/tmp', -100, b'/workspace', 0)
        out['open_by_handle_at'] = sc({nr("open_by_handle_at")}, -100, 0, 0)
    """,
    )
    for name, (res, err) in out.items():
        expected = errno.ENOSYS if name == "clone3" else errno.EPERM
        assert res == -1 and err == expected, (name, out)


def test_kernel_attack_surface_calls_are_refused(kernel: SandboxKernelHandle) -> None:
    out = run_json(
        kernel,
        f"""
        # keyrings: not namespaced; without the filter these succeed
        out['keyctl_get_session'] = sc({nr("keyctl")}, 0, -3, 1)
        out['add_key'] = sc({nr("add_key")}, b'user', b'sandbox-key', b'secret', 6, -3)
        out['request_key'] = sc({nr("request_key")}, b'user', b'sandbox-key', 0, 0)
        params = ctypes.create_string_buffer(120)
        out['io_uring_setup'] = sc({nr("io_uring_setup")}, 4, params)
        out['io_uring_enter'] = sc({nr("io_uring_enter")}, 0, 0, 0, 0, 0, 0)
        out['io_uring_register'] = sc({nr("io_uring_register")}, 0, 0, 0, 0)
        out['userfaultfd_user_mode'] = sc({nr("userfaultfd")}, 1)
        attr = ctypes.create_string_buffer(128)
        ctypes.memmove(attr, (1).to_bytes(4, 'little') + (128).to_bytes(4, 'little'), 8)  # software event, size
        attr[40] = b'\\x60'  # exclude_kernel | exclude_hv
        out['perf_event_open_self'] = sc({nr("perf_event_open")}, attr, 0, -1, -1, 0)
        out['bpf_map_create'] = sc({nr("bpf")}, 0, ctypes.create_string_buffer(72), 72)
        out['kexec_load'] = sc({nr("kexec_load")}, 0, 0, 0, 0)
        out['kexec_file_load'] = sc({nr("kexec_file_load")}, 0, 0, 0, b'', 0)
        out['personality_no_aslr'] = sc({nr("personality")}, 0x0040000)
        out['personality_read_implies_exec'] = sc({nr("personality")}, 0x0400000)
        out['personality_high_bits'] = sc({nr("personality")}, 0x100000000)
        out['libc_personality_no_aslr'] = (_libc.personality(0x0040000), ctypes.get_errno())
        # allowed: the query and the default persona
        out['query'] = sc({nr("personality")}, 0xFFFFFFFF)
        out['default'] = sc({nr("personality")}, 0)
        out['query_after'] = sc({nr("personality")}, 0xFFFFFFFF)
    """,
    )
    for name in ("query", "default", "query_after"):
        res, err = out.pop(name)
        assert res == 0 and err == 0, (name, res, err)
    for name, (res, err) in out.items():
        assert res == -1 and err == errno.EPERM, (name, out)


def test_tiocsti_and_tioclinux_are_refused(kernel: SandboxKernelHandle) -> None:
    out = run_json(
        kernel,
        f"""
        import fcntl, termios, pty
        master, slave = os.openpty()
        try:
            fcntl.ioctl(slave, termios.TIOCSTI, b'x')
            out['fcntl_tiocsti'] = 'pushed'
        except OSError as exc:
            out['fcntl_tiocsti'] = errno.errorcode.get(exc.errno)
        ch = ctypes.c_char(b'x')
        out['raw_tiocsti'] = sc({nr("ioctl")}, slave, 0x5412, ctypes.byref(ch))
        out['raw_tiocsti_high_bits'] = sc({nr("ioctl")}, slave, 0x100005412, ctypes.byref(ch))
        out['raw_tioclinux'] = sc({nr("ioctl")}, slave, 0x541C, ctypes.byref(ch))
        out['tty_still_works'] = list(termios.tcgetattr(slave)[:2]) != []
    """,
    )
    assert out.pop("tty_still_works") is True
    assert out.pop("fcntl_tiocsti") == "EPERM"
    for name, (res, err) in out.items():
        assert res == -1 and err == errno.EPERM, (name, out)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the i386 and x32 ABIs exist on x86_64 only")
def test_foreign_abis_cannot_bypass_the_filter(kernel: SandboxKernelHandle) -> None:
    """The rules are written for the native ABI: an x32 syscall number or an
    i386 ``int 0x80`` must not reach the kernel unfiltered (bad arch -> EPERM)."""
    out = run_json(
        kernel,
        """
        out['x32_getpid'] = sc(0x40000000 | 39)
        out['x32_symlink'] = sc(0x40000000 | 88, b'/etc/passwd', b'/workspace/x32-link')
        # int 0x80 getpid (i386 number 20) from machine code, in a child so a
        # kernel without ia32 emulation (SIGSEGV) cannot take the cell down
        import subprocess, sys
        probe = (
            "import ctypes, mmap\\n"
            "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\\n"
            "m.write(bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3]))\\n"
            "addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\\n"
            "print(ctypes.CFUNCTYPE(ctypes.c_int)(addr)())\\n"
        )
        done = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True)
        out['int80'] = [done.returncode, done.stdout.strip()]
    """,
    )
    assert out["x32_getpid"] == [-1, errno.EPERM], out
    assert out["x32_symlink"] == [-1, errno.EPERM], out
    code, printed = out["int80"]
    assert code != 0 or printed == str(-errno.EPERM), out  # -EPERM, or killed: never a pid
    assert not (kernel.workspace / "x32-link").exists()


def test_normal_notebook_work_still_works(kernel: SandboxKernelHandle) -> None:
    code = textwrap.dedent(
        """
        import multiprocessing as mp, threading, subprocess, concurrent.futures as cf, ctypes
        import pandas as pd, matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        with mp.Pool(2) as pool:
            squares = pool.map(abs, [-1, -2, -3])
        lock = mp.Lock(); q = mp.Queue(); q.put(5)
        p = mp.Process(target=print, args=('child',)); p.start(); p.join()
        with cf.ThreadPoolExecutor(4) as ex:
            threads = sorted(ex.map(lambda v: v * 2, range(4)))
        fork_pid = __import__('os').fork()
        if fork_pid == 0:
            __import__('os')._exit(7)
        forked = __import__('os').waitpid(fork_pid, 0)[1] >> 8
        echoed = subprocess.run(['sh', '-c', 'echo sub'], capture_output=True, text=True).stdout.strip()
        frame = pd.DataFrame({'a': [1, 2]})
        plt.plot([1, 2]); plt.close('all')
        persona = ctypes.CDLL(None).personality(ctypes.c_ulong(0xFFFFFFFF))  # the query, as C passes it
        print('RESULT', squares, q.get(timeout=10), threads, forked, echoed, int(frame.a.sum()), persona)
        """
    )
    run = kernel.run(code, timeout=180)
    assert run.status == "ok", (run.reply, run.stderr)
    assert "RESULT [1, 2, 3] 5 [0, 2, 4, 6] 7 sub 3 0" in run.stdout, run.stdout
    run = kernel.run("!ls /workspace > /dev/null && echo listed")
    assert run.status == "ok" and "listed" in run.stdout, (run.reply, run.stdout)
    run = kernel.run("%timeit -n 3 -r 2 sum(range(100))")
    assert run.status == "ok" and "loops" in run.stdout, (run.reply, run.stdout)


def make_wheel(folder: Path) -> Path:
    """A pure-Python wheel with a console script and an executable data
    script, so that installing it makes pip chmod files (no index needed)."""
    import base64
    import hashlib
    import zipfile

    files = {
        "skmodes/__init__.py": "def main():\n    print('skmodes says hi')\n",
        "skmodes-0.1.data/scripts/skmodes-raw": "#!python\nprint('raw script')\n",
        "skmodes-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: skmodes\nVersion: 0.1\n",
        "skmodes-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "skmodes-0.1.dist-info/entry_points.txt": "[console_scripts]\nskmodes-hi = skmodes:main\n",
    }
    record = []
    wheel = folder / "skmodes-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            data = text.encode()
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100755 if "scripts" in name else 0o100644) << 16
            archive.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        archive.writestr("skmodes-0.1.dist-info/RECORD", "\n".join([*record, "skmodes-0.1.dist-info/RECORD,,"]) + "\n")
    return wheel


def test_pip_install_and_everyday_modes_still_work(kernel: SandboxKernelHandle) -> None:
    """The set-id and whiteout rules refuse two mode bits and one rename flag
    only: pip installing a wheel (it chmods scripts executable), chmod +x,
    0o700, the sticky bit, creating files and folders with ordinary modes, an
    O_TMPFILE, renames and a raw openat that reads (its unused mode register
    holding garbage) all still work, and the host sees the ordinary modes."""
    wheel = make_wheel(kernel.workspace)
    out = run_json(
        kernel,
        f"""
        import stat, subprocess, sys
        os.makedirs('/workspace/modes', exist_ok=True)
        os.chdir('/workspace/modes')
        pip = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-index', '--no-deps', '--no-cache-dir',
                              '--disable-pip-version-check', '--target', '/workspace/modes/target',
                              '/workspace/{wheel.name}'], capture_output=True, text=True)
        out['pip'] = [pip.returncode, pip.stderr[-500:]]
        hi = subprocess.run([sys.executable, '-c', 'import skmodes; skmodes.main()'], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH='/workspace/modes/target'))
        out['import'] = hi.stdout.strip()
        open('script.sh', 'w').write('#!/bin/sh\\necho ran\\n')
        out['chmod +x'] = subprocess.run(['chmod', '+x', 'script.sh']).returncode
        out['ran'] = subprocess.run(['./script.sh'], capture_output=True, text=True).stdout.strip()
        os.chmod('script.sh', 0o700)
        os.mkdir('shared', 0o755)
        os.chmod('shared', 0o1777)
        os.mkdir('private', 0o700)
        os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o644))
        os.rename('made', 'renamed')
        tmp = os.open('.', getattr(os, 'O_TMPFILE', 0o20200000) | os.O_WRONLY, 0o600)
        out['tmpfile'] = os.write(tmp, b'tmpfile')
        os.close(tmp)
        res, err = sc({nr("openat")}, -100, b'renamed', os.O_RDONLY, 0o6000)
        out['openat_read_with_garbage_mode'] = res >= 0
        out['modes'] = {{n: oct(os.lstat(n).st_mode & 0o7777) for n in os.listdir('.')}}
    """,
    )
    assert out["pip"][0] == 0, out
    assert out["import"] == "skmodes says hi" and out["chmod +x"] == 0 and out["ran"] == "ran", out
    assert out["openat_read_with_garbage_mode"] is True, out
    modes = {p.name: os.lstat(p).st_mode & 0o7777 for p in (kernel.workspace / "modes").iterdir()}
    assert modes["script.sh"] == 0o700 and modes["shared"] == 0o1777 and modes["private"] == 0o700, modes
    assert modes["renamed"] == 0o644 & ~0o022 and out["tmpfile"] == 7, (modes, out)
    assert os.lstat(kernel.workspace / "modes" / "target" / "bin" / "skmodes-hi").st_mode & 0o111
    assert os.lstat(kernel.workspace / "modes" / "target" / "bin" / "skmodes-raw").st_mode & 0o111
    assert host_set_id_files(kernel.workspace / "modes") == {}


# ----------------------------------------------------- the jupyter_server edge


def test_planted_save_backup_link_cannot_redirect_a_jupyter_save(kernel: SandboxKernelHandle, tmp_path: Path) -> None:
    """jupyter_server's atomic save copies ``nb.ipynb`` to ``.~nb.ipynb`` first
    (following a symlink there) and writes checkpoints under
    ``.ipynb_checkpoints/``: a cell must not be able to plant either as a link
    to a host file outside the workspace, nor as a whiteout device that makes
    the save fail (ENXIO)."""
    nbformat = pytest.importorskip("nbformat")
    contents = pytest.importorskip("jupyter_server.services.contents.filemanager")
    host_file = tmp_path / "host-bashrc"
    host_file.write_text("untouched\n")
    sub = kernel.workspace / "edge"
    sub.mkdir()
    nb = nbformat.v4.new_notebook()
    nbformat.write(nb, sub / "nb.ipynb")
    out = run_json(
        kernel,
        f"""
        os.makedirs('/workspace/edge/.ipynb_checkpoints', exist_ok=True)
        out['results'] = {{}}
        for name in ('.~nb.ipynb', '.ipynb_checkpoints/nb-checkpoint.ipynb', 'other.ipynb'):
            try:
                os.symlink({str(host_file)!r}, '/workspace/edge/' + name)
                out['results'][name] = 'planted'
            except PermissionError:
                out['results'][name] = 'EPERM'
            # a whiteout (char device 0:0) at the same name: the save would fail with ENXIO
            open('/workspace/edge/src', 'w').close()
            res, err = sc({nr("renameat2")}, -100, b'/workspace/edge/src', -100, b'/workspace/edge/dst', 4)
            if res == 0:
                os.rename('/workspace/edge/src', '/workspace/edge/' + name)
                os.unlink('/workspace/edge/dst')
            else:
                os.unlink('/workspace/edge/src')
            out['results'][name + ' whiteout'] = 'planted' if res == 0 else errno.errorcode.get(err)
    """,
    )
    manager = contents.FileContentsManager(root_dir=str(kernel.workspace))
    model = manager.get("edge/nb.ipynb")
    model["content"]["cells"].append(nbformat.v4.new_markdown_cell("saved from the host"))
    manager.save(model, "edge/nb.ipynb")
    manager.create_checkpoint("edge/nb.ipynb")
    manager.save(model, "edge/nb.ipynb")
    assert host_file.read_text() == "untouched\n", "a save followed a link planted by a cell"
    assert set(out["results"].values()) == {"EPERM"}, out
    assert not [p for p in sub.rglob("*") if p.is_symlink()] and host_device_nodes(sub) == []
    assert "saved from the host" in (sub / "nb.ipynb").read_text()
