"""A real Docker client whose daemon refuses network disconnects.

The ratchet's cut of a container is the daemon's to do; when the daemon
refuses it, what the host does next (fail closed) is what is under test. Only
the refusal is played: the containers, their removal and everything else go
to the real daemon.
"""

from __future__ import annotations

from typing import Any

import docker


class DaemonRefusingDisconnect:
    """The real client, except that the daemon refuses every network
    disconnect (as a daemon in trouble does): only the refusal is played,
    the containers and their removal are real."""

    class _API:
        def __init__(self, api: Any) -> None:
            self._api = api

        def __getattr__(self, name: str) -> Any:
            return getattr(self._api, name)

        def disconnect_container_from_network(self, *args: Any, **kwargs: Any) -> Any:
            raise docker.errors.APIError("refused by the test: daemon in trouble")

    def __init__(self, client: Any) -> None:
        self._client = client
        self.api = self._API(client.api)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
