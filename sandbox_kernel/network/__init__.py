"""The PROXIED network mode: a sandbox's only way out is a host-side egress proxy.

The sandbox has no interface but ``lo``; its HTTP(S) traffic goes through
a forwarder inside it (``worker/proxy_forward.py``) to a unix socket that is
bind-mounted in, served by :class:`~sandbox_kernel.network.proxy.EgressProxy`
on the host. The proxy resolves names itself, applies the allow/deny rules
(:mod:`.egress_rules`), logs every connection (:mod:`.egress_log`), and when
the ratchet rises it closes every tunnel and refuses new ones (``cut``)
without touching the sandbox or its state.
"""

from .egress_log import EgressEntry, EgressLog
from .egress_rules import Decision, EgressPolicy
from .proxy import EgressProxy

__all__ = ["Decision", "EgressEntry", "EgressLog", "EgressPolicy", "EgressProxy"]
