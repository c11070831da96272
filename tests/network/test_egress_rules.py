"""The egress rules: wildcard semantics, deny wins, addresses never reached, rebinding."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sandbox_kernel.network import EgressPolicy
from sandbox_kernel.network.egress_rules import normalise_name

A = ipaddress.ip_address
PUBLIC = [A("93.184.216.34")]


def test_wildcards_and_exact_names() -> None:
    policy = EgressPolicy(allow=["pypi.org", "*.pythonhosted.org"])
    assert policy.check("pypi.org", PUBLIC).allowed
    assert policy.check("PyPI.org.", PUBLIC).allowed  # case and trailing dot
    assert not policy.check("evil-pypi.org", PUBLIC).allowed
    assert not policy.check("x.pypi.org", PUBLIC).allowed
    assert policy.check("files.pythonhosted.org", PUBLIC).allowed
    assert policy.check("a.b.pythonhosted.org", PUBLIC).allowed
    assert not policy.check("pythonhosted.org", PUBLIC).allowed  # *.x is below x only
    assert not policy.check("pythonhosted.org.evil.com", PUBLIC).allowed
    assert policy.check("example.com", PUBLIC).rule.startswith("not in the allow list")


def test_deny_wins_over_allow() -> None:
    policy = EgressPolicy(allow=["*"], deny=["*.internal.example", "tracker.com"])
    verdict = policy.check("db.internal.example", PUBLIC)
    assert not verdict.allowed and verdict.rule == "deny list: *.internal.example"
    assert not policy.check("tracker.com", PUBLIC).allowed
    assert policy.check("other.com", PUBLIC).allowed


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "169.254.1.1",
        "100.100.100.200",
        "fd00:ec2::254",
        "100.64.0.1",
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "255.255.255.255",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::a01:203",  # NAT64 of 10.1.2.3
        "2002:a01:203::1",  # 6to4 of 10.1.2.3
    ],
)
def test_addresses_never_reached(address: str) -> None:
    policy = EgressPolicy()
    assert not policy.check(address, [A(address)]).allowed  # as an IP literal
    assert not policy.check("looks-public.example", [A(address)]).allowed  # as what a name resolves to


def test_rebinding_any_refused_address_refuses_the_name() -> None:
    policy = EgressPolicy(allow=["*.example"])
    verdict = policy.check("cdn.example", [A("93.184.216.34"), A("10.0.0.5")])
    assert not verdict.allowed and "resolves to a refused address" in verdict.rule and "10.0.0.5" in verdict.rule


def test_explicit_addresses_and_extra_refused() -> None:
    policy = EgressPolicy(allow_addresses=["127.0.0.1"], extra_refused=["93.184.216.0/24"])
    assert policy.check("mirror.local", [A("127.0.0.1")]).allowed
    assert not policy.check("mirror.local", [A("127.0.0.2")]).allowed
    verdict = policy.check("jupyter.example", [A("93.184.216.34")])
    assert not verdict.allowed and "address 93.184.216.34 is never reached from a sandbox" in verdict.rule


@pytest.mark.parametrize(
    "spelling", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.000.000.001", "[::ffff:127.0.0.1]"]
)
def test_every_spelling_of_a_denied_address_is_denied(spelling: str) -> None:
    """The C library's resolver reads these as 127.0.0.1; taken for names, they
    passed a deny list naming the address (an attack review: 200 OK)."""
    policy = EgressPolicy(deny=["127.0.0.1"], allow_addresses=["127.0.0.1"])
    verdict = policy.check(spelling, [])
    assert not verdict.allowed and verdict.rule == "deny list: 127.0.0.1", verdict


@pytest.mark.parametrize(
    "spelling", ["1572395042", "0x5db8d822", "93.184.55330", "[::ffff:93.184.216.34]", "[::ffff:5db8:d822]"]
)
def test_a_denied_public_address_is_denied_however_it_is_reached(spelling: str) -> None:
    policy = EgressPolicy(deny=["93.184.216.34"])
    assert policy.check(spelling, []).rule == "deny list: 93.184.216.34"
    verdict = policy.check("www.example.com", [A("93.184.216.34")])  # a name pointing at it
    assert not verdict.allowed and "deny list: 93.184.216.34" in verdict.rule
    assert policy.check("www.example.com", [A("93.184.216.35")]).allowed


def test_a_network_in_allow_addresses_does_not_admit_the_hosts_own_addresses() -> None:
    """``127.0.0.0/30`` for a mirror on ``.2`` admitted the Jupyter server's 127.0.0.1."""
    policy = EgressPolicy(allow_addresses=["127.0.0.0/30"], extra_refused=["127.0.0.1", "192.0.2.2"])
    assert policy.check("mirror.local", [A("127.0.0.2")]).allowed
    assert not policy.check("mirror.local", [A("127.0.0.1")]).allowed
    assert (
        not EgressPolicy(allow_addresses=["192.0.2.0/24"], extra_refused=["192.0.2.2"])
        .check_address(A("192.0.2.2"))
        .allowed
    )
    # the exact address lifts it: the tests' stand-in for a public origin
    assert (
        EgressPolicy(allow_addresses=["127.0.0.1"], extra_refused=["127.0.0.1"]).check_address(A("127.0.0.1")).allowed
    )


def test_a_refusal_does_not_tell_which_addresses_are_the_hosts() -> None:
    policy = EgressPolicy(extra_refused=["172.17.0.1", "192.0.2.2"])
    for own, neighbour in (("172.17.0.1", "172.17.0.9"), ("192.0.2.2", "192.0.2.3")):
        rule, other = policy.check_address(A(own)).rule, policy.check_address(A(neighbour)).rule
        assert rule.replace(own, "X") == other.replace(neighbour, "X"), (rule, other)


def test_no_address_is_refused() -> None:
    assert not EgressPolicy().check("empty.example", []).allowed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"allow": ["*.*.com"]}, "only allowed as the first label"),
        ({"allow": ["bad name.com"]}, "is not a name"),
        ({"deny": "*.com"}, "must be a list"),
        ({"allow_addresses": ["not-an-ip"]}, "is not an IP address"),
    ],
)
def test_bad_rules_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EgressPolicy(**kwargs)  # type: ignore[arg-type]


def test_the_hosts_own_addresses_are_found_and_refused(tmp_path: Path) -> None:
    from sandbox_kernel.network.host_addresses import local_addresses

    (tmp_path / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 93.184.216.34\n        /32 host LOCAL\n"
        "     |-- 93.184.216.0\n        /24 link UNICAST\n     |-- 127.0.0.1\n        /32 host LOCAL\n"
    )
    (tmp_path / "if_inet6").write_text("20010db8000000000000000000000001 02 40 00 80     eth0\n")
    found = local_addresses(tmp_path)
    assert found == ["93.184.216.34", "127.0.0.1", "2001:db8::1"]
    policy = EgressPolicy(extra_refused=found)
    verdict = policy.check("www.example", [A("93.184.216.34")])
    assert not verdict.allowed and "address 93.184.216.34 is never reached" in verdict.rule
    assert local_addresses(tmp_path / "missing") == []  # no /proc: nothing extra, the classes still hold


@pytest.mark.parametrize("literal", ["93.184.216.34", "[2606:2800:220:1::1]", "2606:2800:220:1::1"])
def test_an_ip_literal_is_refused_unless_the_allow_list_names_it(literal: str) -> None:
    """A public IP literal is a destination like a name: ``allow=["pypi.org"]``
    must not let a sandbox reach any server by its address."""
    address = A(literal.strip("[]"))
    policy = EgressPolicy(allow=["pypi.org", "*.pythonhosted.org"])
    verdict = policy.check(literal, [address])
    assert not verdict.allowed
    assert verdict.rule == f"IP literal {address} is not in the allow list (pypi.org, *.pythonhosted.org)"
    # allow_addresses lifts the address classes for allowed names; it does not admit a literal
    assert not EgressPolicy(allow=["pypi.org"], allow_addresses=[str(address)]).check(literal, [address]).allowed
    # the addresses given with a literal are not consulted: the literal is where the proxy connects
    assert not policy.check(literal, [A("151.101.0.223")]).allowed


def test_an_ip_literal_goes_when_listed_or_everything_is_allowed() -> None:
    # listed in any spelling (brackets, zeros) it matches the address, not the text
    listed = EgressPolicy(allow=["pypi.org", "93.184.216.34", "[2606:2800:220:1:0:0:0:1]"])
    assert listed.describe()["allow"] == ["pypi.org", "93.184.216.34", "2606:2800:220:1::1"]
    verdict = listed.check("93.184.216.34", [A("93.184.216.34")])
    assert verdict.allowed and verdict.rule == "allow list: 93.184.216.34"
    assert listed.check("[2606:2800:220:1::1]", [A("2606:2800:220:1::1")]).allowed
    assert not listed.check("93.184.216.35", [A("93.184.216.35")]).allowed
    everything = EgressPolicy()
    verdict = everything.check("93.184.216.34", [A("93.184.216.34")])
    assert verdict.allowed and verdict.rule == "allow list: *"
    # deny wins over '*' for a literal too
    verdict = EgressPolicy(deny=["93.184.216.34"]).check("93.184.216.34", [A("93.184.216.34")])
    assert not verdict.allowed and verdict.rule == "deny list: 93.184.216.34"


def test_a_listed_private_literal_still_needs_its_address_allowed() -> None:
    """The address rules hold for a literal the allow list names: listing
    10.0.0.5 is not enough, allow_addresses must lift its class as well."""
    listed = EgressPolicy(allow=["10.0.0.5"])
    verdict = listed.check("10.0.0.5", [A("10.0.0.5")])
    assert not verdict.allowed and "private address (RFC 1918) 10.0.0.5" in verdict.rule
    both = EgressPolicy(allow=["10.0.0.5"], allow_addresses=["10.0.0.5"])
    assert both.check("10.0.0.5", [A("10.0.0.5")]).allowed
    # loopback is refused by class with the allow list at '*', as before
    assert "loopback address 127.0.0.1" in EgressPolicy().check("127.0.0.1", [A("127.0.0.1")]).rule


def test_international_names_are_encoded_as_dns_resolves_them() -> None:
    """IDNA 2003 (Python's codec) made ``faß.de`` into ``fass.de``, another
    domain: a deny of either spelling missed ``xn--fa-hia.de`` (an attack review)."""
    for pattern in ("faß.de", "xn--fa-hia.de"):
        policy = EgressPolicy(deny=[pattern])
        for name in ("faß.de", "FASS.de".replace("SS", "ß"), "xn--fa-hia.de"):
            assert not policy.check_name(normalise_name(name)).allowed, (pattern, name)
        assert policy.check_name(normalise_name("fass.de")).allowed
    assert normalise_name("ςσ.gr") == "xn--3xac.gr"
    with pytest.raises(ValueError, match="is not a valid host name"):
        normalise_name("a\u200db.com" + "\u0300" * 3)


@pytest.mark.parametrize("ports", [[0], [65536], ["443"], [True], "443"])
def test_a_bad_connect_port_is_named(ports: object) -> None:
    with pytest.raises(ValueError, match="connect_ports"):
        EgressPolicy(connect_ports=ports)  # type: ignore[arg-type]
    assert EgressPolicy(connect_ports=[443, 8443, 443]).connect_ports == (443, 8443)
