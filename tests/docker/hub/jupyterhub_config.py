"""JupyterHub for tests/docker/test_jupyterhub.py: DockerSpawner, loopback only.

Everything specific to one run comes from SK_HUB_* variables set by the test.
The single-user containers share the host's network namespace, so the hub, the
proxy and the servers meet on 127.0.0.1 and nothing connects to a bridge
address. Every container gets the narrow settings of docs/deploy/container.md:
uid 1000, no capabilities, no new privileges, a read-only root, the seccomp
profile, and no masked /proc paths.
"""

import json
import os
from pathlib import Path

from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port

c = get_config()  # type: ignore[name-defined]  # noqa: F821 - provided by JupyterHub

E = os.environ
test_id = E["SK_HUB_ID"]


class HostNetworkSpawner(DockerSpawner):  # type: ignore[misc]
    """DockerSpawner on the host's network: each server on its own loopback port."""

    async def start(self):  # type: ignore[no-untyped-def]
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):  # type: ignore[no-untyped-def]
        return "127.0.0.1", self.port


c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(E["SK_HUB_PROXY_PORT"])
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(E["SK_HUB_PORT"])
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{E['SK_HUB_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [E["SK_HUB_CHP"]]
c.JupyterHub.db_url = f"sqlite:///{E['SK_HUB_DIR']}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{E['SK_HUB_DIR']}/cookie_secret"
c.JupyterHub.pid_file = f"{E['SK_HUB_DIR']}/jupyterhub.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.log_level = "INFO"

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = set(E["SK_HUB_USERS"].split(","))
c.DummyAuthenticator.password = E["SK_HUB_PASSWORD"]
c.JupyterHub.services = [{"name": "tester", "api_token": E["SK_HUB_TOKEN"]}]
c.JupyterHub.load_roles = [
    {"name": "tester", "services": ["tester"], "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"]}
]

c.JupyterHub.spawner_class = HostNetworkSpawner
c.DockerSpawner.image = E["SK_HUB_IMAGE"]
c.DockerSpawner.network_name = "host"
c.DockerSpawner.use_internal_ip = True  # no port bindings (host network): get_ip_and_port answers
c.DockerSpawner.ip = "127.0.0.1"
c.DockerSpawner.remove = True
c.DockerSpawner.name_template = f"skhub-{test_id}-{{username}}"
c.DockerSpawner.notebook_dir = "/home/jovyan/work"
c.DockerSpawner.start_timeout = 120
c.DockerSpawner.http_timeout = 120
c.DockerSpawner.cmd = json.loads(E["SK_HUB_CMD"]) or None
# each user's home: a folder of the test's, mounted for that user only
c.DockerSpawner.volumes = {
    **{k: {"bind": v, "mode": "ro"} for k, v in json.loads(E["SK_HUB_RO_MOUNTS"]).items()},
    f"{E['SK_HUB_DIR']}/homes/{{username}}": "/home/jovyan",
    E["SK_HUB_PG_DIR"]: E["SK_HUB_PG_DIR"],
    E["SK_HUB_KERNEL_CONFIG"]: {"bind": "/etc/jupyter/sandbox_kernel_config.py", "mode": "ro"},
}
c.DockerSpawner.environment = {"HOME": "/home/jovyan", **json.loads(E["SK_HUB_ENV"])}
c.DockerSpawner.extra_create_kwargs = {
    "user": "1000:1000",
    "labels": {"sandbox_kernel.owner_pid": E["SK_HUB_OWNER_PID"]},
    # systempaths=unconfined: the Engine API's form (docker-py has no argument for it)
    "host_config": {"MaskedPaths": [], "ReadonlyPaths": []},
}
c.DockerSpawner.extra_host_config = {
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges", "seccomp=" + Path(E["SK_HUB_SECCOMP"]).read_text()],
    "read_only": True,
    "tmpfs": {"/tmp": "exec,size=256m"},
}
