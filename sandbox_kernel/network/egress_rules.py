"""Which connections leave: domain allow/deny lists and the addresses never reached.

Rules, in order (the first that applies decides):

1. A name in ``deny`` is refused (deny wins over allow).
2. A name not in ``allow`` is refused (the default ``allow`` is ``*``: the
   public internet).
3. Every address the name resolves to must be public: loopback, private
   (RFC 1918, ULA), link-local, cloud metadata, CGNAT, multicast, reserved
   and unspecified addresses, their IPv4-mapped, NAT64 and 6to4 forms, and
   ``extra_refused`` (the Jupyter server's addresses) are refused unless the
   exact address is in ``allow_addresses``. One refused address refuses the
   name (DNS rebinding: an allowed name pointing inside is refused), and the
   proxy connects only to the addresses it checked.

Patterns: ``pypi.org`` is that name exactly; ``*.pypi.org`` is any name
below it (``files.pypi.org``, ``a.b.pypi.org``) but not ``pypi.org``
itself, as in TLS certificates but at any depth; ``*`` is every name.

An IP literal (``93.184.216.34``, ``[2606:2800::1]``) is a destination like
a name: the deny list refuses it when it lists that address, the address
rules apply to it, and it goes only if the allow list is ``*`` or lists that
exact address. Otherwise ``allow=["pypi.org"]`` would still let a sandbox
reach any public server by its address. ``allow_addresses`` does not admit
a literal: it only lifts the address classes for names already allowed.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import idna

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: addresses no sandbox reaches unless one is allowed by address, with the reason shown
REFUSED_NETWORKS: tuple[tuple[str, str], ...] = (
    ("169.254.169.254/32", "cloud metadata address"),
    ("100.100.100.200/32", "cloud metadata address"),
    ("fd00:ec2::254/128", "cloud metadata address"),
    ("0.0.0.0/8", "unspecified/this-network address"),
    ("10.0.0.0/8", "private address (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (CGNAT)"),
    ("127.0.0.0/8", "loopback address"),
    ("169.254.0.0/16", "link-local address"),
    ("172.16.0.0/12", "private address (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignment"),
    ("192.0.2.0/24", "documentation address"),
    ("192.168.0.0/16", "private address (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking address"),
    ("198.51.100.0/24", "documentation address"),
    ("203.0.113.0/24", "documentation address"),
    ("224.0.0.0/4", "multicast address"),
    ("240.0.0.0/4", "reserved address"),
    ("::/128", "unspecified address"),
    ("::1/128", "loopback address"),
    ("fc00::/7", "private address (unique local)"),
    ("fe80::/10", "link-local address"),
    ("ff00::/8", "multicast address"),
    ("2001:db8::/32", "documentation address"),
)
_REFUSED = tuple((ipaddress.ip_network(net), why) for net, why in REFUSED_NETWORKS)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_6TO4 = ipaddress.ip_network("2002::/16")


@dataclass(frozen=True)
class Decision:
    """Whether a connection may go, and the rule that said so (shown to the user)."""

    allowed: bool
    rule: str


def normalise_name(name: str) -> str:
    """Lower case, no trailing dot, IDNA (ASCII) form; ValueError naming a bad name.

    A name that is not ASCII is encoded as DNS resolves it today (IDNA 2008,
    UTS #46 without the transitional mappings, by the ``idna`` package):
    Python's own ``idna`` codec (IDNA 2003) maps ``faß.de`` to ``fass.de``,
    another domain than ``xn--fa-hia.de``, so a deny rule written either way
    missed the real name (an attack review)."""
    text = name.strip().rstrip(".").lower()
    if not text or len(text) > 253:
        raise ValueError(f"{name!r} is not a host name")
    if not text.isascii():
        try:
            text = idna.encode(text, uts46=True, transitional=False).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            raise ValueError(f"{name!r} is not a valid host name") from None
    if any(not _LABEL.match(label) for label in text.split(".")):
        raise ValueError(f"{name!r} is not a valid host name")
    return text


def _pattern(raw: str) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"domain pattern {raw!r} must be a string")
    text = raw.strip()
    if text == "*":
        return text
    literal = _literal(text)
    if literal is not None:
        return str(literal)
    wildcard = text.startswith("*.")
    if "*" in (text[2:] if wildcard else text):
        raise ValueError(f"domain pattern {raw!r}: '*' is only allowed as the first label")
    try:
        name = normalise_name(text[2:] if wildcard else text)
    except ValueError:
        raise ValueError(f"domain pattern {raw!r} is not a name, '*.<name>' or '*'") from None
    return f"*.{name}" if wildcard else name


def matches(pattern: str, name: str) -> bool:
    """Whether a normalised name matches a normalised pattern."""
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern


def parse_address(host: str) -> IPAddress | None:
    """The address a host string is, if it is an IP literal (``[::1]`` included),
    or an IPv4 address in a spelling the C library's resolver also reads as
    one (:func:`_c_ipv4`)."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return _c_ipv4(text)


#: what an IPv4 address in ``inet_aton``'s spellings is made of
_C_IPV4 = re.compile(r"[0-9a-fA-FxX.]{1,64}\Z")


def _c_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``: not
    addresses to Python's ``ipaddress``, but to ``getaddrinfo`` (glibc's
    ``inet_aton``), which the proxy would have resolved them with. Taken for
    names, they passed a deny list that names the address (an attack review
    reached a denied 127.0.0.1 as ``127.1``)."""
    if not _C_IPV4.match(text) or not text[0].isdigit():
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def _literal(text: str) -> IPAddress | None:
    """The address a pattern is, if it is one (``[v6]`` too, never a zone ``%eth0``),
    so that a pattern keeps the one spelling ``str(address)`` a literal is matched by."""
    if "%" in text:
        return None
    return parse_address(text)


def _embedded(address: IPAddress) -> list[IPAddress]:
    """The IPv4 addresses an IPv6 address stands for (mapped, NAT64, 6to4)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    out: list[IPAddress] = []
    if address.ipv4_mapped is not None:
        out.append(address.ipv4_mapped)
    if address in _NAT64:
        out.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        out.append(address.sixtofour)
    return out


@dataclass
class EgressPolicy:
    """The rules of one session's proxy (see the module docstring)."""

    allow: Sequence[str] = ("*",)
    deny: Sequence[str] = ()
    #: exact addresses or networks allowed although refused by class (e.g. a local mirror)
    allow_addresses: Sequence[str] = ()
    #: further addresses or networks always refused (the Jupyter server's)
    extra_refused: Sequence[str] = ()
    #: the ports a CONNECT tunnel may go to: what passes inside one is not
    #: read, so to an allowed name's port 80 it carried plain requests with
    #: any ``Host`` (a denied site on a shared address), as many as it liked,
    #: logged as one CONNECT (an attack review)
    connect_ports: Sequence[int] = (443,)
    _allow: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _deny: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _allowed_nets: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    _extra_nets: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # one form whatever was given (lists from traitlets, tuples here): equal rules compare equal
        self.allow = tuple(_strings(self.allow, "allow"))
        self.deny = tuple(_strings(self.deny, "deny"))
        self.allow_addresses = tuple(_strings(self.allow_addresses, "allow_addresses"))
        self.extra_refused = tuple(_strings(self.extra_refused, "extra_refused"))
        self._allow = tuple(_pattern(p) for p in _strings(self.allow, "allow"))
        self._deny = tuple(_pattern(p) for p in _strings(self.deny, "deny"))
        self._allowed_nets = tuple(
            _network(a, "allow_addresses") for a in _strings(self.allow_addresses, "allow_addresses")
        )
        self._extra_nets = tuple(_network(a, "extra_refused") for a in _strings(self.extra_refused, "extra_refused"))
        self.connect_ports = _ports(self.connect_ports, "connect_ports")

    def check_tunnel(self, port: int) -> Decision | None:
        """Why a CONNECT to ``port`` is refused, or None."""
        if port in self.connect_ports:
            return None
        listed = ", ".join(map(str, self.connect_ports)) or "none"
        return Decision(False, f"CONNECT only to port {listed} (egress_connect_ports), not {port}")

    def check_name(self, name: str) -> Decision:
        """The domain rules for a (normalised) name."""
        for pattern in self._deny:
            if matches(pattern, name):
                return Decision(False, f"deny list: {pattern}")
        for pattern in self._allow:
            if matches(pattern, name):
                return Decision(True, f"allow list: {pattern}")
        return Decision(False, f"not in the allow list ({', '.join(self._allow) or 'empty'})")

    def check_address(self, address: IPAddress) -> Decision:
        """The address rules for one address a connection would go to.

        The host's own addresses (``extra_refused``) are lifted only by an
        exact address in ``allow_addresses``, never by a network holding one
        (``127.0.0.0/30`` for a mirror on ``.2`` admitted the Jupyter server's
        ``127.0.0.1``). The reason given for them is their class's, as for
        any refused address: a particular one told a cell which addresses
        are the host's."""
        exact = any(net.num_addresses == 1 and address in net for net in self._allowed_nets)
        candidates = (address, *_embedded(address))
        for candidate in candidates:
            if not exact and any(candidate in net for net in self._extra_nets):
                own = _refused_class(candidate) or "address"
                return Decision(False, f"{own} {address} is never reached from a sandbox")
        if any(address in net for net in self._allowed_nets):
            return Decision(True, f"address {address} allowed explicitly")
        for candidate in candidates:
            refused = _refused_class(candidate)
            if refused is not None:
                return Decision(False, f"{refused} {address} is never reached from a sandbox")
        return Decision(True, "public address")

    def denied_address(self, address: IPAddress) -> str | None:
        """The deny-list entry naming ``address`` or an IPv4 address it stands for, if any."""
        for candidate in (address, *_embedded(address)):
            if str(candidate) in self._deny:
                return str(candidate)
        return None

    def check_literal(self, address: IPAddress) -> Decision:
        """The rules for an IP literal: deny list, address classes, then the allow list,
        which must be ``*`` or name this exact address (a literal is a destination
        the allow list has to grant like any name, not a way around it)."""
        key = str(address)
        denied = self.denied_address(address)
        if denied is not None:
            return Decision(False, f"deny list: {denied}")
        verdict = self.check_address(address)
        if not verdict.allowed:
            return verdict
        if key in self._allow:
            return Decision(True, f"allow list: {key}")
        if "*" in self._allow:
            return Decision(True, "allow list: *")
        allowed = ", ".join(self._allow) or "empty"
        return Decision(False, f"IP literal {key} is not in the allow list ({allowed})")

    def check(self, host: str, addresses: Iterable[IPAddress]) -> Decision:
        """The whole decision for ``host`` resolved to ``addresses`` (all must pass).

        An IP literal is its own and only address: ``addresses`` is ignored for it,
        so a caller cannot pair an allowed literal with other addresses."""
        literal = parse_address(host)
        if literal is not None:
            return self.check_literal(literal)
        decision = self.check_name(normalise_name(host))
        if not decision.allowed:
            return decision
        checked = list(addresses)
        if not checked:
            return Decision(False, f"{host} has no address")
        for address in checked:
            denied = self.denied_address(address)
            if denied is not None:  # a name for a denied address is that address
                return Decision(False, f"{host} resolves to a denied address: deny list: {denied}")
            verdict = self.check_address(address)
            if not verdict.allowed:
                return Decision(False, f"{host} resolves to a refused address: {verdict.rule}")
        return decision

    def describe(self) -> dict[str, list[str]]:
        """The rules in force, for the widget and the agent tools."""
        return {
            "allow": list(self._allow),
            "deny": list(self._deny),
            "allow_addresses": [str(n) for n in self._allowed_nets],
            "connect_ports": [str(port) for port in self.connect_ports],
        }


def _refused_class(address: IPAddress) -> str | None:
    """The refused class an address is in ("private address"...), if any."""
    return next((why for net, why in _REFUSED if address.version == net.version and address in net), None)


def _ports(values: Sequence[int], what: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{what} must be a list of port numbers, got {values!r}")
    for port in values:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"{what}: {port!r} is not a port number (1 to 65535)")
    return tuple(dict.fromkeys(values))


def _strings(values: Sequence[str] | str, what: str) -> list[str]:
    if isinstance(values, str):
        raise ValueError(f"{what} must be a list of strings, not a single string {values!r}")
    return list(values)


def _network(text: str, what: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(str(text).strip(), strict=False)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not an IP address or network") from None


__all__ = ["REFUSED_NETWORKS", "Decision", "EgressPolicy", "matches", "normalise_name", "parse_address"]
