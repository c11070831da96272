"""The host-side privacy model: the ratchet only goes up, the store fails closed.

Guarantee 3 (the ratchet never goes down) and guarantee 7 (bad input gets a
clear error, nothing stored is lost) as far as the privacy package can prove
them on its own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import re
import stat
from pathlib import Path

import pytest

from sandbox_kernel.privacy import (
    MAX_FILE_BYTES,
    SOURCES,
    Dataset,
    NetworkMode,
    PrivacyState,
    PrivacyStore,
    PrivacyStoreError,
    PrivateData,
    Sensitivity,
    SessionMark,
    default_data_dir,
    default_store,
    default_user_id,
    get_network_mode,
    session_has_private_data,
    session_id_for_notebook,
    validate_id,
)
from sandbox_kernel.privacy import schema as schema_mod
from sandbox_kernel.privacy import state as state_mod
from sandbox_kernel.privacy import store as store_mod

USER = "alice"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "data" / "privacy"


@pytest.fixture
def store(root: Path) -> PrivacyStore:
    return PrivacyStore(root)


def _pd(store: PrivacyStore, session: str = "s1") -> PrivateData:
    return PrivateData(USER, session, store)


def _on_disk(store: PrivacyStore, session: str = "s1") -> dict:
    return json.loads(store.path_for(USER, session).read_text())


def _valid_doc(session: str, level: str = "PUBLIC", private: bool = False, datasets=()) -> dict:
    return {
        "schema": "sandbox_kernel.privacy",
        "version": 1,
        "user_id": USER,
        "session_id": session,
        "private": private,
        "level": level,
        "datasets": list(datasets),
        "mark": None,
        "omitted_datasets": 0,
        "updated_at": "2024-01-01T00:00:00.000Z",
    }


def _plant(store: PrivacyStore, session: str, content: bytes) -> Path:
    path = store.path_for(USER, session)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


# --------------------------------------------------------------- Sensitivity


def test_sensitivity_levels_are_ordered():
    assert Sensitivity.PUBLIC < Sensitivity.INTERNAL < Sensitivity.CONFIDENTIAL < Sensitivity.SECRET
    assert max(Sensitivity.INTERNAL, Sensitivity.SECRET, Sensitivity.PUBLIC) is Sensitivity.SECRET
    assert Sensitivity.names() == ("PUBLIC", "INTERNAL", "CONFIDENTIAL", "SECRET")


@pytest.mark.parametrize("text", ["secret", "SECRET", "Secret", " secret "])
def test_sensitivity_parse_is_case_insensitive(text):
    assert Sensitivity.parse(text) is Sensitivity.SECRET
    assert Sensitivity.parse(Sensitivity.INTERNAL) is Sensitivity.INTERNAL


@pytest.mark.parametrize("bad", ["topsecret", "", "3", 3, None, 2.0, True])
def test_sensitivity_parse_bad_value_names_value_and_allowed(bad):
    with pytest.raises(ValueError) as info:
        Sensitivity.parse(bad)
    msg = str(info.value)
    assert repr(bad) in msg or str(bad) in msg
    assert "PUBLIC" in msg and "SECRET" in msg


# --------------------------------------------------------------- Dataset


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("x" * 129, "129"),
        ("a\nb", "non-printable"),
        ("a\x00b", "non-printable"),
        ("a\x1b[31m", "non-printable"),
        (42, "string"),
    ],
)
def test_dataset_bad_name_is_refused_with_clear_error(store, name, fragment):
    with pytest.raises(ValueError, match=fragment):
        _pd(store).add_private_dataset(name)
    assert not _pd(store).has_private_data  # nothing half-written


def test_dataset_name_limits_and_unicode_accepted(store):
    _pd(store).add_private_dataset("x" * 128)
    _pd(store).add_private_dataset("Patienten – Zürich 病人")
    assert {d.name for d in _pd(store).datasets} == {"x" * 128, "Patienten – Zürich 病人"}


def test_dataset_bad_source_names_allowed_sources(store):
    with pytest.raises(ValueError) as info:
        _pd(store).add_private_dataset("d", source="sandbox")
    assert "'sandbox'" in str(info.value)
    for source in SOURCES:
        assert source in str(info.value)


def test_dataset_record_has_iso_utc_time_and_source(store):
    state = _pd(store).add_private_dataset("d", "internal", "connector")
    (d,) = state.datasets
    assert (d.name, d.sensitivity, d.source) == ("d", Sensitivity.INTERNAL, "connector")
    assert d.added_at.endswith("Z") and "T" in d.added_at


def test_attack_registering_private_data_as_public_is_refused(store):
    # PUBLIC is not a private level: allowing it would give "has a dataset"
    # but FULL network, two answers to "is this session private?".
    with pytest.raises(ValueError, match="not a private level"):
        _pd(store).add_private_dataset("d", Sensitivity.PUBLIC)
    with pytest.raises(ValueError, match="not a private level"):
        _pd(store).mark_private("public", "widget", "x")


# --------------------------------------------------------------- ratchet


def test_new_session_is_public_with_full_network(store):
    pd = _pd(store)
    assert pd.has_private_data is False
    assert pd.sensitivity is Sensitivity.PUBLIC
    assert pd.datasets == []
    assert get_network_mode(USER, "s1", store) is NetworkMode.FULL
    assert not store.path_for(USER, "s1").exists()  # reading writes nothing


def test_adding_dataset_makes_session_private_and_cuts_network(store):
    state = _pd(store).add_private_dataset("patients")
    assert state.has_private_data and state.sensitivity is Sensitivity.CONFIDENTIAL
    assert state.network_mode is NetworkMode.NONE
    assert get_network_mode(USER, "s1", store) is NetworkMode.NONE
    assert session_has_private_data(USER, "s1", store)
    assert get_network_mode(USER, "other", store) is NetworkMode.FULL


def test_readding_dataset_higher_raises_its_level(store):
    pd = _pd(store)
    pd.add_private_dataset("d", "internal")
    state = pd.add_private_dataset("d", "secret")
    assert [(d.name, d.sensitivity) for d in state.datasets] == [("d", Sensitivity.SECRET)]
    assert pd.sensitivity is Sensitivity.SECRET


def test_attack_readding_dataset_lower_keeps_higher(store):
    pd = _pd(store)
    pd.add_private_dataset("d", "secret")
    state = pd.add_private_dataset("d", "internal")
    assert state.dataset("d").sensitivity is Sensitivity.SECRET
    assert state.sensitivity is Sensitivity.SECRET
    assert _on_disk(store)["datasets"][0]["level"] == "SECRET"


def test_attack_adding_lower_dataset_keeps_session_level(store):
    pd = _pd(store)
    pd.add_private_dataset("a", "secret")
    pd.add_private_dataset("b", "internal")
    assert pd.sensitivity is Sensitivity.SECRET
    assert {d.name for d in pd.datasets} == {"a", "b"}


def test_attack_setting_attributes_to_lower_raises(store):
    pd = _pd(store)
    pd.add_private_dataset("d", "secret")
    for name, value in [
        ("sensitivity", Sensitivity.PUBLIC),
        ("has_private_data", False),
        ("datasets", []),
        ("network_mode", NetworkMode.FULL),
        ("_store", PrivacyStore(store.root.parent / "empty")),
        ("_session_id", "fresh"),
        ("anything_new", 1),
    ]:
        with pytest.raises(AttributeError):
            setattr(pd, name, value)
    with pytest.raises(AttributeError):
        del pd.sensitivity
    with pytest.raises(AttributeError):
        store._root = store.root.parent / "empty"  # type: ignore[misc]
    assert pd.sensitivity is Sensitivity.SECRET and pd.has_private_data


def test_attack_state_objects_are_frozen_and_consistent(store):
    state = _pd(store).add_private_dataset("d", "secret")
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.sensitivity = Sensitivity.PUBLIC  # type: ignore[misc]
    # A hand-made state that claims "public" while holding a SECRET dataset is refused.
    with pytest.raises(ValueError):
        PrivacyState(
            has_private_data=False,
            sensitivity=Sensitivity.PUBLIC,
            datasets=state.datasets,
            network_mode=NetworkMode.FULL,
        )
    with pytest.raises(ValueError):
        PrivacyState(has_private_data=True, sensitivity=Sensitivity.SECRET, datasets=(), network_mode=NetworkMode.FULL)


@pytest.mark.parametrize("cls", [PrivateData, PrivacyStore])
def test_attack_no_public_method_lowers_or_clears(cls):
    words = (
        "clear",
        "remove",
        "reset",
        "lower",
        "delete",
        "unset",
        "discard",
        "drop",
        "forget",
        "unmark",
        "set_",
        "downgrade",
        "pop",
        "write_state",
        "overwrite",
    )
    public = [n for n in dir(cls) if not n.startswith("_")]
    offenders = [n for n in public if any(w in n.lower() for w in words)]
    assert offenders == [], f"{cls.__name__} exposes {offenders}"
    for name in public:
        attr = getattr(cls, name)
        if isinstance(attr, property):
            assert attr.fset is None and attr.fdel is None, f"{cls.__name__}.{name} is settable"


def test_attack_new_private_data_object_on_same_session_sees_level(store):
    _pd(store).add_private_dataset("d", "secret")
    fresh = PrivateData(USER, "s1", store)
    assert fresh.sensitivity is Sensitivity.SECRET
    fresh.add_private_dataset("e", "internal")
    assert _pd(store).sensitivity is Sensitivity.SECRET


def test_attack_new_store_object_on_same_root_sees_level(store, root):
    _pd(store).add_private_dataset("d", "secret")
    other = PrivacyStore(root)
    assert other.read(USER, "s1").sensitivity is Sensitivity.SECRET
    assert get_network_mode(USER, "s1", PrivacyStore(str(root))) is NetworkMode.NONE


def test_attack_writing_a_public_state_object_changes_nothing(store):
    _pd(store).add_private_dataset("d", "secret")
    before = _on_disk(store)
    store.merge(USER, "s1", PrivacyState.public())
    lower = PrivacyState.build(datasets=[Dataset.create("d", "internal")])
    state = store.merge(USER, "s1", lower)
    assert state.sensitivity is Sensitivity.SECRET
    assert state.dataset("d").sensitivity is Sensitivity.SECRET
    assert _on_disk(store)["level"] == before["level"] == "SECRET"


def test_attack_file_rewritten_lower_under_running_process(store, caplog):
    pd = _pd(store)
    pd.add_private_dataset("d", "secret")
    # Someone on the host replaces the file with a valid, public one.
    path = store.path_for(USER, "s1")
    tmp = path.with_name("planted")
    tmp.write_text(json.dumps(_valid_doc("s1")))
    os.replace(tmp, path)
    with caplog.at_level(logging.WARNING, logger="sandbox_kernel.privacy"):
        assert pd.sensitivity is Sensitivity.SECRET  # this process remembers
    assert "holds less" in caplog.text
    pd.add_private_dataset("e", "internal")  # the next write puts it back on disk
    doc = _on_disk(store)
    assert doc["level"] == "SECRET" and {d["name"] for d in doc["datasets"]} == {"d", "e"}


def test_attack_file_deleted_under_running_process(store):
    pd = _pd(store)
    pd.add_private_dataset("d", "confidential")
    store.path_for(USER, "s1").unlink()
    assert pd.sensitivity is Sensitivity.CONFIDENTIAL
    assert get_network_mode(USER, "s1", store) is NetworkMode.NONE


# --------------------------------------------------------------- mark_private


def test_mark_private_without_dataset(store):
    pd = _pd(store)
    state = pd.mark_private(Sensitivity.SECRET, "widget", "user clicked 'private'")
    assert state.has_private_data and state.sensitivity is Sensitivity.SECRET
    assert state.datasets == () and state.mark.source == "widget"
    assert state.mark.reason == "user clicked 'private'"
    assert _on_disk(store)["mark"]["level"] == "SECRET"
    assert get_network_mode(USER, "s1", store) is NetworkMode.NONE


def test_attack_lower_mark_keeps_higher(store):
    pd = _pd(store)
    pd.mark_private("secret", "widget", "first")
    state = pd.mark_private("internal", "tool", "second")
    assert state.sensitivity is Sensitivity.SECRET and state.mark.reason == "first"


def test_mark_private_bad_reason_is_refused(store):
    with pytest.raises(ValueError, match="non-printable"):
        _pd(store).mark_private("secret", "widget", "a\x1b[2Jb")
    with pytest.raises(ValueError, match="at most 1000"):
        _pd(store).mark_private("secret", "widget", "x" * 1001)
    assert not _pd(store).has_private_data


def test_mark_private_reason_line_breaks_become_spaces(store):
    state = _pd(store).mark_private("internal", "widget", "line one\r\nline\ttwo\n" + "x" * 980)
    assert state.mark.reason.startswith("line one line two ")


# --------------------------------------------------------------- persistence


def _read_level_in_child(root: str, session: str, queue) -> None:
    state = PrivacyStore(root).read(USER, session)
    queue.put((state.sensitivity.name, sorted(d.name for d in state.datasets), state.error))


def test_state_persists_into_a_fresh_process(store, root):
    _pd(store).add_private_dataset("d", "confidential")
    _pd(store).add_private_dataset("e", "internal")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_read_level_in_child, args=(str(root), "s1", queue))
    proc.start()
    result = queue.get(timeout=60)
    proc.join(timeout=60)
    assert result == ("CONFIDENTIAL", ["d", "e"], None)


def _add_many(root: str, worker: int, count: int, start, errors) -> None:
    try:
        start.wait(timeout=60)
        pd = PrivateData(USER, "shared", PrivacyStore(root))
        levels = ["internal", "confidential", "internal", "secret" if worker == 2 else "internal"]
        for i in range(count):
            pd.add_private_dataset(f"w{worker}-d{i}", levels[i % 4], "tool")
    except BaseException as exc:  # pragma: no cover - reported to the parent
        errors.put(f"worker {worker}: {exc!r}")


def test_concurrent_writers_in_four_processes_lose_no_update(root):
    ctx = multiprocessing.get_context("spawn")
    start, errors = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_add_many, args=(str(root), w, 25, start, errors)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    assert errors.empty()
    doc = json.loads((root / USER / "shared.json").read_text())
    names = {d["name"] for d in doc["datasets"]}
    assert names == {f"w{w}-d{i}" for w in range(4) for i in range(25)}
    assert doc["level"] == "SECRET"
    state = PrivacyStore(root).read(USER, "shared")
    assert len(state.datasets) == 100 and state.sensitivity is Sensitivity.SECRET
    leftovers = [p.name for p in (root / USER).iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def _add_in_child(root: str, session: str, name: str, level: str) -> None:
    PrivateData(USER, session, PrivacyStore(root)).add_private_dataset(name, level, "tool")


def _run_child(target, *args) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0


def test_poll_sees_change_made_by_another_process(store, root, monkeypatch):
    monkeypatch.setattr(store_mod, "_SETTLE_NS", 0)  # let the cache work at full speed
    reader = _pd(store)
    _run_child(_add_in_child, str(root), "s1", "d", "internal")
    assert reader.sensitivity is Sensitivity.INTERNAL
    assert reader.sensitivity is Sensitivity.INTERNAL  # cached, still right
    _run_child(_add_in_child, str(root), "s1", "d", "secret")
    assert reader.sensitivity is Sensitivity.SECRET
    _run_child(_add_in_child, str(root), "s1", "e", "internal")
    assert {d.name for d in reader.datasets} == {"d", "e"}


def test_poll_of_unchanged_file_does_not_parse_again(store, monkeypatch):
    monkeypatch.setattr(store_mod, "_SETTLE_NS", 0)  # files younger than 1 s are not cached
    _pd(store).add_private_dataset("d")
    store.read(USER, "s1")
    calls = []
    real = store_mod.decode
    monkeypatch.setattr(store_mod, "decode", lambda *a: calls.append(1) or real(*a))
    for _ in range(5):
        assert store.read(USER, "s1").sensitivity is Sensitivity.CONFIDENTIAL
    assert calls == []
    PrivacyStore(store.root).add_dataset(USER, "s1", Dataset.create("e", "secret"))
    assert store.read(USER, "s1").sensitivity is Sensitivity.SECRET


def test_poll_of_just_written_file_is_not_cached(store, monkeypatch):
    # Coarse timestamps: a file changed in the last second may be replaced by
    # one with the same inode, size and times, so it is read again.
    _pd(store).add_private_dataset("d")
    calls = []
    real = store_mod.decode
    monkeypatch.setattr(store_mod, "decode", lambda *a: calls.append(1) or real(*a))
    store.read(USER, "s1")
    store.read(USER, "s1")
    assert len(calls) == 2


# --------------------------------------------------------------- fails closed


def _assert_secret_with_error(store: PrivacyStore, session: str, fragment: str) -> PrivacyState:
    state = store.read(USER, session)
    assert state.has_private_data is True
    assert state.sensitivity is Sensitivity.SECRET
    assert state.network_mode is NetworkMode.NONE
    assert state.error and fragment in state.error, state.error
    assert str(store.path_for(USER, session)) in state.error
    assert state.to_json()["error"] == state.error
    assert get_network_mode(USER, session, store) is NetworkMode.NONE
    return state


def test_corrupt_json_fails_closed_and_is_logged(store, caplog):
    _plant(store, "s1", b'{"schema": "sandbox_kernel.privacy", "version": 1, ')
    with caplog.at_level(logging.ERROR, logger="sandbox_kernel.privacy"):
        _assert_secret_with_error(store, "s1", "not valid JSON")
    assert any(r.name == "sandbox_kernel.privacy" and "not valid JSON" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "doc, fragment",
    [
        ([], "not an object"),
        ({"schema": "other"}, "schema"),
        ({**_valid_doc("s1"), "version": "1"}, "version"),
        ({**_valid_doc("s1"), "version": 0}, "version"),
        ({**_valid_doc("s1"), "session_id": "s2"}, "belongs to"),
        ({**_valid_doc("s1"), "level": "TOPSECRET"}, "TOPSECRET"),
        ({**_valid_doc("s1"), "datasets": {"a": 1}}, "datasets"),
        (
            {
                **_valid_doc("s1"),
                "datasets": [{"name": "a", "level": "PUBLIC", "source": "api", "added_at": "2024-01-01T00:00:00Z"}],
            },
            "not a private level",
        ),
        ({**_valid_doc("s1"), "datasets": [{"name": "a"}]}, "lacks"),
        ({**_valid_doc("s1"), "private": "no"}, "private"),
        ({**_valid_doc("s1"), "private": True}, "private is true"),
    ],
)
def test_wrong_schema_fails_closed(store, doc, fragment):
    _plant(store, "s1", json.dumps(doc).encode())
    _assert_secret_with_error(store, "s1", fragment)


def test_non_utf8_file_fails_closed(store):
    _plant(store, "s1", b"\xff\xfe{}")
    _assert_secret_with_error(store, "s1", "UTF-8")


def test_attack_symlink_to_a_public_file_fails_closed(store, tmp_path):
    decoy = tmp_path / "decoy.json"
    decoy.write_text(json.dumps(_valid_doc("s1")))  # valid, public
    path = store.path_for(USER, "s1")
    path.parent.mkdir(parents=True)
    path.symlink_to(decoy)
    _assert_secret_with_error(store, "s1", "symlink")
    state = _pd(store).add_private_dataset("d", "internal")  # never writes through the link
    assert state.sensitivity is Sensitivity.SECRET
    assert json.loads(decoy.read_text()) == _valid_doc("s1")
    assert not path.is_symlink() and _on_disk(store)["level"] == "SECRET"
    (aside,) = [p for p in path.parent.iterdir() if ".corrupt-" in p.name]
    assert aside.is_symlink()


def test_attack_symlinked_user_directory_fails_closed(store, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "s1.json").write_text(json.dumps(_valid_doc("s1")))
    store.root.mkdir(parents=True)
    (store.root / USER).symlink_to(elsewhere)
    _assert_secret_with_error(store, "s1", "not a plain directory")
    with pytest.raises(PrivacyStoreError):
        _pd(store).add_private_dataset("d")
    assert _pd(store).sensitivity is Sensitivity.SECRET


@pytest.mark.timeout(20)
def test_attack_fifo_in_place_of_file_fails_closed_without_hanging(store):
    path = store.path_for(USER, "s1")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    _assert_secret_with_error(store, "s1", "FIFO")
    state = _pd(store).add_private_dataset("d", "internal")  # must not hang either
    assert state.sensitivity is Sensitivity.SECRET and state.dataset("d")
    assert stat.S_ISREG(os.lstat(path).st_mode)


def test_directory_in_place_of_file_fails_closed_and_is_moved_aside(store):
    path = store.path_for(USER, "s1")
    path.mkdir(parents=True)
    _assert_secret_with_error(store, "s1", "directory")
    state = _pd(store).add_private_dataset("d", "internal")
    assert state.sensitivity is Sensitivity.SECRET and state.error is None
    assert [p for p in path.parent.iterdir() if p.is_dir() and ".corrupt-" in p.name]


def test_attack_oversized_file_fails_closed(store):
    doc = _valid_doc("s1")
    doc["padding"] = "x" * MAX_FILE_BYTES
    _plant(store, "s1", json.dumps(doc).encode())
    _assert_secret_with_error(store, "s1", "limit")


def test_unreadable_file_fails_closed(store):
    path = _plant(store, "s1", json.dumps(_valid_doc("s1")).encode())
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything: emulate with a file of another kind
        path.unlink()
        os.mkfifo(path)
    _assert_secret_with_error(store, "s1", "")


def test_adding_to_corrupt_store_keeps_secret_and_keeps_bad_file_aside(store):
    bad = b'{"level": "SECRET", "datasets": [ truncated'
    path = _plant(store, "s1", bad)
    state = _pd(store).add_private_dataset("new", "internal", "tool")
    assert state.sensitivity is Sensitivity.SECRET and state.has_private_data
    assert state.dataset("new").sensitivity is Sensitivity.INTERNAL
    assert state.error is None  # the store is healthy again ...
    assert "kept aside" in state.mark.reason and state.mark.sensitivity is Sensitivity.SECRET
    asides = [p for p in path.parent.iterdir() if p.name.startswith("s1.json.corrupt-")]
    assert len(asides) == 1 and asides[0].read_bytes() == bad  # ... and nothing is lost
    doc = _on_disk(store)
    assert doc["level"] == "SECRET" and doc["mark"]["level"] == "SECRET"
    # A fresh process (no memory of this one) sees SECRET too.
    assert schema_mod.decode(path.read_bytes(), USER, "s1").sensitivity is Sensitivity.SECRET


def test_file_from_newer_version_is_never_overwritten(store):
    doc = {**_valid_doc("s1"), "version": 99}
    path = _plant(store, "s1", json.dumps(doc).encode())
    _assert_secret_with_error(store, "s1", "newer")
    with pytest.raises(PrivacyStoreError, match="refusing to overwrite"):
        _pd(store).add_private_dataset("d")
    assert json.loads(path.read_text())["version"] == 99
    assert _pd(store).sensitivity is Sensitivity.SECRET


def test_write_refused_for_newer_version_still_keeps_secret_in_process(store):
    path = _plant(store, "s1", json.dumps({**_valid_doc("s1"), "version": 2}).encode())
    with pytest.raises(PrivacyStoreError, match="newer"):  # no read before: the write finds it
        _pd(store).add_private_dataset("d", "internal")
    path.write_text(json.dumps(_valid_doc("s1")))  # even if it then turns public on disk
    assert _pd(store).sensitivity is Sensitivity.SECRET


def test_attack_lock_file_symlink_is_refused(store, tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep me")
    lock = store.root / USER / "s1.lock"
    lock.parent.mkdir(parents=True)
    lock.symlink_to(target)
    with pytest.raises(PrivacyStoreError, match="symlink"):
        _pd(store).add_private_dataset("d")
    assert target.read_text() == "keep me"
    assert _pd(store).has_private_data  # this process still keeps what it was told


def test_failed_write_raises_but_process_stays_private(store, monkeypatch):
    def broken_replace(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod.os, "replace", broken_replace)
    with pytest.raises(PrivacyStoreError, match="No space left"):
        _pd(store).add_private_dataset("d", "secret")
    monkeypatch.undo()
    assert _pd(store).sensitivity is Sensitivity.SECRET
    assert get_network_mode(USER, "s1", store) is NetworkMode.NONE
    assert [p.name for p in (store.root / USER).iterdir() if ".tmp-" in p.name] == []
    _pd(store).add_private_dataset("e", "internal")
    assert _on_disk(store)["level"] == "SECRET"


def test_get_network_mode_fails_closed_on_unexpected_error(store, monkeypatch):
    def boom(self, user_id, session_id):
        raise RuntimeError("boom")

    monkeypatch.setattr(PrivacyStore, "read", boom)
    assert get_network_mode(USER, "s1", store) is NetworkMode.NONE


# --------------------------------------------------------------- on-disk format


def test_store_dirs_are_0700_and_files_0600_even_with_lax_umask(store):
    old = os.umask(0)
    try:
        _pd(store).add_private_dataset("d")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store.root / USER).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store.path_for(USER, "s1")).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.root / USER / "s1.lock").st_mode) == 0o600


def test_loose_existing_store_dir_is_tightened(root):
    root.mkdir(parents=True, mode=0o755)
    root.chmod(0o755)
    PrivateData(USER, "s1", PrivacyStore(root)).add_private_dataset("d")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


def test_file_format_has_schema_version_and_fields(store):
    _pd(store).add_private_dataset("d", "internal", "mount")
    doc = _on_disk(store)
    assert doc["schema"] == "sandbox_kernel.privacy" and doc["version"] == 1
    assert (doc["user_id"], doc["session_id"], doc["private"], doc["level"]) == (USER, "s1", True, "INTERNAL")
    assert doc["datasets"][0].keys() == {"name", "level", "source", "added_at"}
    assert doc["mark"] is None and doc["omitted_datasets"] == 0


def test_to_json_is_the_widget_dict(store):
    assert PrivacyState.public().to_json() == {
        "private": False,
        "level": "PUBLIC",
        "network": "full",
        "datasets": [],
        "error": None,
    }
    state = _pd(store).add_private_dataset("d", "secret", "widget")
    out = json.loads(json.dumps(state.to_json()))
    assert out.keys() == {"private", "level", "network", "datasets", "error"}
    assert (out["private"], out["level"], out["network"], out["error"]) == (True, "SECRET", "none", None)
    assert out["datasets"][0].keys() == {"name", "level", "source", "added_at"}


def test_worst_case_dataset_list_stays_under_the_read_limit():
    names = [f"{i:04d}" + "\U0001f512" * 124 for i in range(state_mod.MAX_DATASETS + 5)]
    states = [PrivacyState.build(datasets=[Dataset.create(n, "secret", "connector")]) for n in names]
    merged = state_mod.merge(*states)
    assert len(merged.datasets) == state_mod.MAX_DATASETS and merged.omitted_datasets == 5
    assert len(schema_mod.encode(merged, USER, "s1")) < MAX_FILE_BYTES


def test_datasets_beyond_the_limit_still_raise_the_level(store, monkeypatch):
    monkeypatch.setattr(state_mod, "MAX_DATASETS", 2)
    pd = _pd(store)
    pd.add_private_dataset("a", "internal")
    pd.add_private_dataset("b", "internal")
    state = pd.add_private_dataset("c", "secret")
    assert state.sensitivity is Sensitivity.SECRET and state.omitted_datasets == 1
    assert _on_disk(store)["level"] == "SECRET"


def test_default_store_location(monkeypatch, tmp_path):
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "sk"))
    assert default_data_dir() == tmp_path / "sk"
    assert default_store().root == tmp_path / "sk" / "privacy"
    monkeypatch.delenv("SANDBOX_KERNEL_DATA_DIR")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jd"))
    assert default_store().root == tmp_path / "jd" / "sandbox_kernel" / "privacy"
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "sk"))
    PrivateData(USER, "s1").add_private_dataset("d")
    assert (tmp_path / "sk" / "privacy" / USER / "s1.json").is_file()
    assert get_network_mode(USER, "s1") is NetworkMode.NONE


# --------------------------------------------------------------- identity


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("../x", "'/'"),
        ("a/b", "'/'"),
        ("", "empty"),
        ("x" * 65, "65 characters"),
        (".hidden", "start with '.'"),
        ("..", "start with '.'"),
        (".", "start with '.'"),
        ("-rf", "start with '-'"),
        ("a b", "' '"),
        ("a\x00b", "'\\x00'"),
        (None, "string"),
    ],
)
@pytest.mark.parametrize("field", ["user_id", "session_id"])
def test_attack_bad_ids_are_refused_naming_the_field(store, value, fragment, field):
    with pytest.raises(ValueError) as info:
        validate_id(value, field)
    assert str(info.value).startswith(field) and fragment in str(info.value)
    ids = {"user_id": USER, "session_id": "s1", field: value}
    for call in (
        lambda: PrivateData(ids["user_id"], ids["session_id"], store),
        lambda: store.read(ids["user_id"], ids["session_id"]),
        lambda: get_network_mode(ids["user_id"], ids["session_id"], store),
    ):
        with pytest.raises(ValueError, match=field):
            call()
    assert not store.root.exists()


def test_valid_ids_are_accepted():
    for value in ["a", "A-1.b_c", "x" * 64, "_x", "9"]:
        assert validate_id(value, "session_id") == value


def test_default_user_id_is_a_valid_id():
    assert validate_id(default_user_id(), "user_id")


def test_session_id_for_notebook_is_stable_and_distinct(tmp_path, monkeypatch):
    nb = tmp_path / "Analysis 2024 (final).ipynb"
    a = session_id_for_notebook(str(nb))
    assert a == session_id_for_notebook(str(nb)) == session_id_for_notebook(nb)
    assert validate_id(a, "session_id") and a.startswith("Analysis_2024_final_-")
    monkeypatch.chdir(tmp_path)
    assert session_id_for_notebook(nb.name) == a  # relative path, same notebook
    assert session_id_for_notebook(str(tmp_path / "sub" / ".." / nb.name)) == a
    assert session_id_for_notebook(str(tmp_path / "other" / nb.name)) != a
    assert session_id_for_notebook(str(tmp_path / "b.ipynb")) != session_id_for_notebook(str(tmp_path / "c.ipynb"))
    long = session_id_for_notebook("/x/" + "y" * 300 + ".ipynb")
    assert validate_id(long, "session_id") and len(long) <= 64
    assert validate_id(session_id_for_notebook("/x/../.ipynb"), "session_id")


@pytest.mark.parametrize("bad", ["", "   ", None])
def test_session_id_for_empty_notebook_path_raises(bad):
    with pytest.raises(ValueError, match="notebook path"):
        session_id_for_notebook(bad)


def test_records_refuse_bad_timestamps():
    with pytest.raises(ValueError, match="ISO 8601"):
        Dataset(name="d", sensitivity=Sensitivity.SECRET, added_at="yesterday", source="api")
    with pytest.raises(ValueError, match="UTC"):
        SessionMark(Sensitivity.SECRET, "api", "", "2024-01-01T00:00:00+02:00")


def test_the_default_user_is_the_hub_user_under_jupyterhub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hub container runs as jovyan: the hub's user name keeps their ratchets apart."""
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    os_user = default_user_id()
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    assert default_user_id() == "alice"
    monkeypatch.setenv("JUPYTERHUB_USER", "bob@example.org/../x")
    assert re.fullmatch(r"bob_example.org_.._x-[0-9a-f]{16}", default_user_id())
    # names that folded into one id each have their own (an attack review:
    # "zoé" and "zoë" were both "zo_", one ratchet and one list of datasets)
    ids = set()
    monkeypatch.setenv("JUPYTERHUB_USER", "zoé")
    taken = default_user_id()  # (a user naming themselves after it gets another)
    for name in ("zoé", "zoë", "zo_", "alice+x@ex.org", "alice_x_ex.org", "a" * 65, "a" * 66, taken):
        monkeypatch.setenv("JUPYTERHUB_USER", name)
        ids.add(validate_id(default_user_id(), "user_id"))
    assert len(ids) == 8, ids
    monkeypatch.setenv("JUPYTERHUB_USER", "")
    assert default_user_id() == os_user


def _rise_each(root: str, count: int) -> None:
    """Another process's rises, one new session after another."""
    writer = PrivacyStore(Path(root))
    for number in range(count):
        writer.mark("u", f"s{number}", SessionMark.create(Sensitivity.CONFIDENTIAL, "api", "rows"))


def test_a_read_during_another_process_rise_is_not_taken_for_a_lowered_record(tmp_path: Path) -> None:
    """A rise leaves its high-water marker before its record: a read in
    between found the marker above the record and failed closed at SECRET,
    naming a store file as lowered (seen from a notebook whose folder
    another session was raising)."""
    store = PrivacyStore(tmp_path)
    count = 300
    writer = multiprocessing.get_context("spawn").Process(target=_rise_each, args=(str(tmp_path), count))
    writer.start()
    seen: dict[int, PrivacyState] = {}
    try:
        while writer.is_alive():  # each session's first private read, as its rise is being made
            for number in range(count):
                if number not in seen and (state := store.read("u", f"s{number}")).has_private_data:
                    seen[number] = state
    finally:
        writer.join(60)
    assert len(seen) > count // 10, len(seen)  # the reads did meet the rises
    wrong = {n: s.sensitivity.name for n, s in seen.items() if s.sensitivity != Sensitivity.CONFIDENTIAL or s.error}
    assert not wrong, wrong
