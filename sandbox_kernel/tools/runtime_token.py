"""The bearer token an HTTP MCP server generates when none is configured.

A server on 127.0.0.1 without a token could be driven by every local account
of the machine (a shared JupyterHub node): run code in this user's sandbox,
read this user's workspace. So, like Jupyter Server, ``sandbox-kernel mcp``
makes a token for the run and leaves it where only its user can read it: a
0600 file in the Jupyter runtime directory (``jupyter --runtime-dir``, where
Jupyter keeps its own ``jpserver-*.json`` files with their tokens).

The directory must be the user's and writable by nobody else; it is created
0700 when missing. The file is created under a random name with
``O_CREAT | O_EXCL | O_NOFOLLOW`` and renamed into place: a symlink planted at
the predictable name is replaced, never followed, and a file a crashed server
left there is replaced too. Every step goes through a descriptor of the
directory, so the directory checked is the one written to. On removal the
file is unlinked only if it is still the one this server wrote.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat

from jupyter_core.paths import jupyter_runtime_dir

from ..privacy.store import replace_file

log = logging.getLogger("sandbox_kernel.tools.mcp")

#: bytes of randomness of a generated token (``secrets.token_urlsafe``: 43 characters)
TOKEN_BYTES = 32


def generate_token() -> str:
    """A fresh bearer token: 256 random bits, URL-safe (an HTTP header value as is)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_file_name(host: str, port: int) -> str:
    """``sandbox-kernel-mcp-<host>-<port>.token``: one name per bind address, so two
    servers never share a file (a second server on a taken address fails to bind
    before it writes anything). Characters other than ``[A-Za-z0-9.:-]`` become ``_``."""
    return f"sandbox-kernel-mcp-{re.sub(r'[^A-Za-z0-9.:-]', '_', host)}-{port}.token"


class RuntimeTokenError(OSError):
    """The token file cannot be written safely; the message says where and why."""


def _open_private_dir(directory: str) -> int:
    """A descriptor of ``directory`` (created 0700 when missing), which must be owned
    by this user and writable by no one else: anyone who can write there could
    swap the file between its creation and a client reading it."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise RuntimeTokenError(f"cannot create or open the runtime directory {directory}: {exc}") from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"it belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"other users may write to it (mode {stat.S_IMODE(st.st_mode):o}; fix: chmod 700 {directory})"
    if problem:
        os.close(fd)
        raise RuntimeTokenError(f"the runtime directory {directory} is not private: {problem}")
    return fd


def check_private_dir(directory: str | None = None) -> str:
    """The runtime directory (default: Jupyter's), created 0700 if missing;
    :class:`RuntimeTokenError` if it is not private, as :meth:`RuntimeTokenFile.write`
    would find (to fail before a server binds its port)."""
    directory = os.path.abspath(directory or jupyter_runtime_dir())
    os.close(_open_private_dir(directory))
    return directory


class RuntimeTokenFile:
    """A token written to ``<runtime dir>/<name>`` (mode 0600) for the life of a server."""

    def __init__(self, dir_fd: int, directory: str, name: str, identity: tuple[int, int]) -> None:
        self._dir_fd = dir_fd
        self.path = os.path.join(directory, name)
        self._name = name
        self._identity = identity

    @classmethod
    def write(cls, token: str, name: str, directory: str | None = None) -> RuntimeTokenFile:
        """Write ``token`` (and a newline) to ``name`` in ``directory`` (default: the
        Jupyter runtime directory, ``$JUPYTER_RUNTIME_DIR``). :class:`RuntimeTokenError`
        if the directory is not private or the file cannot be written."""
        directory = os.path.abspath(directory or jupyter_runtime_dir())
        dir_fd = _open_private_dir(directory)
        try:
            _note_replaced(dir_fd, directory, name)
            # the rename replaces the name itself: a symlink there is not followed
            st = replace_file(dir_fd, name, (token + "\n").encode())
        except OSError as exc:
            os.close(dir_fd)
            raise RuntimeTokenError(f"cannot write the token file {os.path.join(directory, name)}: {exc}") from None
        return cls(dir_fd, directory, name, (st.st_dev, st.st_ino))

    def remove(self) -> None:
        """Unlink the file if it is still the one :meth:`write` made (another
        server may have replaced it since); idempotent."""
        if self._dir_fd < 0:
            return
        try:
            st = os.stat(self._name, dir_fd=self._dir_fd, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == self._identity:
                os.unlink(self._name, dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the token file %s: %s", self.path, exc)
        finally:
            os.close(self._dir_fd)
            self._dir_fd = -1


def _note_replaced(dir_fd: int, directory: str, name: str) -> None:
    """Warn when something other than a regular file of this user sits where the
    token goes (it is replaced, not followed): someone or something planted it."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else f"a file of mode {st.st_mode:o}, uid {st.st_uid}"
        log.warning("replacing %s at %s with the token file (not following it)", kind, os.path.join(directory, name))
