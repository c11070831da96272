#!/usr/bin/env bash
# Build the single-user image for JupyterHub (and `sandbox-kernel mcp` over HTTP)
# without pulling from any image registry:
#   1. the wheel of this checkout (the Lab extension prebuilt inside it);
#   2. a Debian rootfs made by Debian's mmdebstrap from Debian's archive, with
#      Python, bubblewrap and passt; a venv in /opt/sandbox-kernel with the wheel
#      (extras lab, postgresql, mcp: JupyterLab, Notebook 7, ipywidgets, the shared
#      ratchet store, the MCP server), jupyterhub-singleuser and the usual
#      data-science packages;
#   3. `docker import` into the local daemon, as uid 1000 by default.
# Steps 2-3 make a base image (everything but the wheel), kept under a tag of
# its inputs (this script's base section, the dependencies it installs, the
# suite, mirror and extra packages); the final image is that base with this checkout's wheel
# installed (`docker build`, offline). A change of the package's code rebuilds
# only that last layer: seconds, not the minutes of a new rootfs.
# Run the container with docker/seccomp-bwrap.json and unmasked /proc paths so
# its kernels can sandbox cells (docs/deploy/container.md).
#
# usage: scripts/build-image.sh [TAG]      (default sandbox-kernel-singleuser:latest)
# env:   SANDBOX_IMAGE_SUITE (bookworm), SANDBOX_IMAGE_MIRROR (Debian's, or the
#        machine's apt proxy), SANDBOX_IMAGE_PACKAGES (extra pip packages)
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${1:-sandbox-kernel-singleuser:latest}"
SUITE="${SANDBOX_IMAGE_SUITE:-bookworm}"
MIRROR="${SANDBOX_IMAGE_MIRROR:-http://deb.debian.org/debian}"
PIP_PACKAGES="jupyterhub>=5 numpy pandas matplotlib scipy tqdm ${SANDBOX_IMAGE_PACKAGES:-}"

need() {  # need COMMAND DEBIAN_PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ]; then
        echo "build-image: installing $2" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
    else
        echo "build-image: $1 is missing: sudo apt-get install $2" >&2
        exit 1
    fi
}
need mmdebstrap mmdebstrap
need docker docker.io
if [ ! -x .venv/bin/python ]; then
    bash scripts/setup.sh
fi
bash scripts/ensure-docker.sh >/dev/null

start=$(date +%s)
work="$(mktemp -d "${TMPDIR:-/var/tmp}/sandbox-kernel-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels"
echo "build-image: the wheel of this checkout" >&2
.venv/bin/python -m pip wheel --no-deps --no-build-isolation -q -w "$work/wheels" . 2>/dev/null \
    || .venv/bin/python -m pip wheel --no-deps -q -w "$work/wheels" .
wheel="$(ls "$work"/wheels/sandbox_kernel-*.whl)"

# pip in the new root trusts what pip trusts here (a machine behind a TLS proxy
# has its CA in this bundle); the copy is removed before the import. requests
# prefers REQUESTS_CA_BUNDLE to pip's --cert, so both are set, and this
# machine's find-links folder does not exist in the new root.
ca="${PIP_CERT:-$(.venv/bin/python -c 'import ssl; print(ssl.get_default_verify_paths().openssl_cafile)')}"

# quoted for the hook's shell (">=" and "[...]" are shell syntax there)
quoted_packages="'/tmp/wheels/$(basename "$wheel")[lab,postgresql,mcp]'"
for package in $PIP_PACKAGES; do
    quoted_packages="$quoted_packages '$package'"
done

# The base: everything but the package's own code (its dependencies come
# from this wheel's metadata, then the package is uninstalled again).
# Its inputs: the lines between the markers, the package's dependencies, the settings.
base_inputs="$(
    sed -n '/^# >>> base$/,/^# <<< base$/p' scripts/build-image.sh
    .venv/bin/python -c 'import json, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; extras = p.get("optional-dependencies", {}); print(json.dumps([p.get("dependencies"), [extras.get(x) for x in ("lab", "postgresql", "mcp")]]))'
    echo "$SUITE $MIRROR $PIP_PACKAGES"
)"
BASE="sandbox-kernel-singleuser-base:$(printf '%s' "$base_inputs" | sha256sum | cut -c1-16)"
# >>> base
if docker image inspect "$BASE" >/dev/null 2>&1; then
    echo "build-image: the base $BASE is there already" >&2
else
    echo "build-image: the rootfs of $BASE (mmdebstrap $SUITE)" >&2
    # The customize hook runs in the new root with the host's network: pip fetches
    # from PyPI (or the machine's index), and nothing is fetched at run time.
    mmdebstrap --variant=minbase --quiet \
        --include=python3,python3-venv,bubblewrap,passt,libseccomp2,ca-certificates,tini,bash,procps,less,git \
        --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp '$wheel' \"\$1/tmp/wheels/\" && cp '$ca' \"\$1/tmp/wheels/ca.pem\"" \
        --customize-hook="chroot \"\$1\" python3 -m venv /opt/sandbox-kernel" \
        --customize-hook="chroot \"\$1\" env -u PIP_FIND_LINKS PIP_CERT=/tmp/wheels/ca.pem REQUESTS_CA_BUNDLE=/tmp/wheels/ca.pem SSL_CERT_FILE=/tmp/wheels/ca.pem /opt/sandbox-kernel/bin/pip install -q --no-cache-dir --disable-pip-version-check $quoted_packages" \
        --customize-hook="chroot \"\$1\" /opt/sandbox-kernel/bin/pip uninstall -q -y --disable-pip-version-check sandbox-kernel" \
        --customize-hook="chroot \"\$1\" /opt/sandbox-kernel/bin/python -m compileall -q /opt/sandbox-kernel/lib" \
        --customize-hook="rm -rf \"\$1/tmp/wheels\" \"\$1/root/.cache\" \"\$1/var/cache/apt\"/*.bin \"\$1/var/lib/apt/lists\"/*" \
        --customize-hook="chroot \"\$1\" useradd --uid 1000 --user-group --create-home --shell /bin/bash jovyan" \
        --customize-hook="mkdir -p \"\$1/etc/jupyter\"" \
        --customize-hook="printf '%s\n' 'from sandbox_kernel import lab_content_policy' 'lab_content_policy.apply(c)' > \"\$1/etc/jupyter/jupyter_server_config.py\"" \
        "$SUITE" "$work/rootfs.tar" "$MIRROR"
    echo "build-image: docker import $BASE" >&2
    docker import \
        --change 'USER 1000' \
        --change 'WORKDIR /home/jovyan' \
        --change 'ENV PATH=/opt/sandbox-kernel/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV HOME=/home/jovyan' \
        --change 'ENTRYPOINT ["/usr/bin/tini", "--"]' \
        --change 'CMD ["jupyterhub-singleuser"]' \
        --change 'LABEL sandbox_kernel.image=singleuser-base' \
        "$work/rootfs.tar" "$BASE" >/dev/null
    rm -f "$work/rootfs.tar"
    # older bases (other inputs) are not needed by this checkout any more
    docker image ls --filter 'label=sandbox_kernel.image=singleuser-base' --format '{{.Repository}}:{{.Tag}}' \
        | grep -vxF "$BASE" | grep -v '<none>' | xargs -r docker image rm >/dev/null 2>&1 || true
fi
# <<< base

# The package itself, offline (no network in the build's containers).
echo "build-image: $TAG = $BASE + $(basename "$wheel")" >&2
mkdir -p "$work/context"
cp "$wheel" "$work/context/"
cp docker/seccomp-bwrap.json "$work/context/seccomp-bwrap.json"
cat > "$work/context/Dockerfile" <<DOCKERFILE
FROM $BASE
USER root
COPY $(basename "$wheel") /tmp/wheels/
COPY seccomp-bwrap.json /etc/jupyter/seccomp-bwrap.json
RUN /opt/sandbox-kernel/bin/pip install -q --no-deps --no-index --no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl \\
 && /opt/sandbox-kernel/bin/python -m compileall -q /opt/sandbox-kernel/lib/python3*/site-packages/sandbox_kernel \\
 && /opt/sandbox-kernel/bin/python -I -m sandbox_kernel install --prefix /opt/sandbox-kernel >/dev/null \\
 && rm -rf /tmp/wheels /root/.cache
USER 1000
LABEL sandbox_kernel.image=singleuser
DOCKERFILE
# the classic builder: it needs no buildx plugin, and FROM takes the local base
if ! built="$(DOCKER_BUILDKIT=0 docker build -q --network none --rm -t "$TAG" "$work/context" 2>&1)"; then
    echo "$built" >&2
    exit 1
fi
size=$(docker image inspect "$TAG" --format '{{.Size}}')
echo "build-image: $TAG built in $(( $(date +%s) - start )) s, $(( size / 1024 / 1024 )) MiB" >&2
