"""An image built without pulling anything: for tests and offline machines.

``ensure_test_image(client)`` imports (``docker import``) a rootfs made in memory
that holds only directories, the merged-/usr symlinks and a minimal passwd/group.
Programs come from the host: the container mounts the host's ``/usr`` read-only
(:func:`offline_mounts`), which is enough for bash, coreutils and the system
Python. ``/sbin`` is a real, empty directory because Docker bind-mounts its init
at ``/sbin/docker-init``, which cannot land inside a read-only ``/usr`` mount.

This is not the image to run untrusted code for real users: build
``docker/Dockerfile`` for that.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
from typing import Any

from .config import ContainerConfig

TEST_IMAGE = "sandbox-kernel-test:offline"
IMAGE_LABEL = "sandbox_kernel.image"
IMAGE_LABEL_VALUE = "offline-test"

_PASSWD = (
    "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    "sandbox:x:1000:1000:sandbox:/tmp:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"


def build_rootfs_tar() -> bytes:
    """The rootfs tarball (deterministic: same bytes, same image id)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:

        def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        def directory(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            add(info)

        def symlink(name: str, target: str) -> None:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            info.mode = 0o777
            add(info)

        def regular(name: str, text: str, mode: int = 0o644) -> None:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            add(info, data)

        for name in ("usr", "sbin", "etc", "proc", "dev", "sys", "workspace", "home", "var", "run"):
            directory(name)
        directory("tmp", 0o1777)
        for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            symlink(name, target)
        symlink("var/tmp", "../tmp")
        regular("etc/passwd", _PASSWD)
        regular("etc/group", _GROUP)
        regular("etc/hostname", "sandbox\n")
        regular("etc/hosts", "127.0.0.1\tlocalhost\n")
        regular("etc/resolv.conf", "")
    return buf.getvalue()


def _image_id(client: Any, tag: str) -> str | None:
    import docker

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    if (image.labels or {}).get(IMAGE_LABEL) != IMAGE_LABEL_VALUE:
        raise RuntimeError(f"image {tag!r} exists but was not built by sandbox_kernel; pick another tag")
    image_id: str = image.id
    return image_id


def build_test_image(client: Any, tag: str = TEST_IMAGE) -> str:
    """Import the offline rootfs as ``tag``; returns the image id."""
    repository, _, version = tag.rpartition(":")
    if not repository or "/" in version:
        repository, version = tag, "latest"
    changes = [
        f"LABEL {IMAGE_LABEL}={IMAGE_LABEL_VALUE}",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        "ENV HOME=/tmp",
        "WORKDIR /workspace",
        "USER 65534:65534",
        'CMD ["sleep", "infinity"]',
    ]
    client.api.import_image_from_data(build_rootfs_tar(), repository=repository, tag=version, changes=changes)
    image_id = _image_id(client, tag)
    if image_id is None:
        raise RuntimeError(f"importing the offline image {tag!r} failed")
    return image_id


def ensure_test_image(client: Any, tag: str = TEST_IMAGE) -> str:
    """``tag``, after building it if absent (nothing is pulled)."""
    if _image_id(client, tag) is None:
        build_test_image(client, tag)
    return tag


def remove_test_image(client: Any, tag: str = TEST_IMAGE) -> bool:
    """Remove the offline image if it is ours; True if something was removed."""
    import docker

    image_id = _image_id(client, tag)
    if image_id is None:
        return False
    try:
        client.images.remove(image_id, force=True)
    except docker.errors.ImageNotFound:
        return False
    return True


def host_python_mounts() -> dict[str, str]:
    """Read-only mounts that make this process's Python usable at the same paths.

    Empty when it lives under ``/usr`` (covered by :func:`offline_mounts`); else its
    installation prefix and, for a virtualenv, the venv (mounted at their own paths,
    so shebangs and ``pyvenv.cfg`` keep working).
    """
    mounts: dict[str, str] = {}
    for prefix in {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}:
        if prefix == "/usr" or prefix.startswith("/usr/"):
            continue
        mounts[prefix] = prefix
    return mounts


def offline_mounts(*, python: bool = False) -> dict[str, str]:
    """``{"/usr": "/usr"}`` (plus :func:`host_python_mounts` when ``python``)."""
    mounts = {"/usr": "/usr"}
    if python:
        mounts.update(host_python_mounts())
    return mounts


def offline_config(*, python: bool = False, **overrides: Any) -> ContainerConfig:
    """A ``ContainerConfig`` for the offline image with the host mounts it needs."""
    mounts = {**offline_mounts(python=python), **overrides.pop("read_only_mounts", {})}
    return ContainerConfig(image=overrides.pop("image", TEST_IMAGE), read_only_mounts=mounts, **overrides)
