"""A real Docker client whose daemon refuses network disconnects, or stops answering.

The ratchet's cut of a container is the daemon's to do; when the daemon
refuses it, or cannot be reached, what the host does next (fail closed) is what
is under test. Only the refusal is played: the containers, and everything the
daemon is not asked meanwhile, are real.
"""

from __future__ import annotations

import time
from typing import Any

import requests

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


class DaemonGoneAway:
    """The real client, except that while ``down`` is set every call of its
    low-level API fails as it does when the daemon's socket stops answering (a
    daemon restarted or killed in the middle of a rise): the containers
    themselves are real."""

    class _API:
        def __init__(self, api: Any, owner: DaemonGoneAway) -> None:
            self._api = api
            self._owner = owner

        def __getattr__(self, name: str) -> Any:
            attribute = getattr(self._api, name)
            if not self._owner.down or not callable(attribute):
                return attribute

            def unreachable(*args: Any, **kwargs: Any) -> Any:
                raise requests.exceptions.ConnectionError(
                    f"{name}: ('Connection aborted.', FileNotFoundError(2, 'No such file or directory'))"
                )

            return unreachable

    def __init__(self, client: Any) -> None:
        self._client = client
        self.api = self._API(client.api, self)
        self.down = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class DaemonSlowToDisconnect:
    """The real client, except that the daemon takes ``delay`` seconds to
    start each network disconnect (a daemon under load): the disconnect
    itself, and everything else, is real."""

    class _API:
        def __init__(self, api: Any, delay: float) -> None:
            self._api = api
            self._delay = delay

        def __getattr__(self, name: str) -> Any:
            return getattr(self._api, name)

        def disconnect_container_from_network(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(self._delay)
            return self._api.disconnect_container_from_network(*args, **kwargs)

    def __init__(self, client: Any, delay: float) -> None:
        self._client = client
        self.api = self._API(client.api, delay)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
