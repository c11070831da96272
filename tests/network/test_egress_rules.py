"""The egress rules: wildcard semantics, deny wins, addresses never reached, rebinding."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sandbox_kernel.network import EgressPolicy

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
    assert not verdict.allowed and "protected" in verdict.rule


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
    assert not verdict.allowed and "this host's own" in verdict.rule
    assert local_addresses(tmp_path / "missing") == []  # no /proc: nothing extra, the classes still hold
