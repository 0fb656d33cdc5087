"""The tamper suite: any single change to a valid certificate makes `govern check` fail (1 or 4), never 0.

The hypothesis part runs the checker in-process for speed; test_cli.py runs the same kinds of damage
through the real command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from govern.certificate._certificate import Certificate, check_certificate
from govern.certificate._errors import CertificateInvalid, CertificateUnreadable
from govern.certificate._make import certify
from govern.certificate._signing import generate_key_pair, load_private_key

from .conftest import lamp_registry, orders_registry


def _signed(certificate: Certificate, directory: Path) -> bytes:
    generate_key_pair(directory / "key", overwrite=True)
    return certificate.signed(load_private_key(directory / "key")).to_bytes()


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    directory = tmp_path_factory.mktemp("keys")
    orders = certify(orders_registry())
    lamp = certify(lamp_registry())
    files = {"orders": orders.to_bytes(), "lamp": lamp.to_bytes(),
             "orders-signed": _signed(orders, directory)}
    for data in files.values():
        check_certificate(data)
    return files


def _refused(data: bytes) -> bool:
    try:
        check_certificate(data)
    except (CertificateInvalid, CertificateUnreadable):
        return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["orders", "lamp", "orders-signed"]), position=st.floats(0, 1, exclude_max=True),
       replacement=st.integers(0, 255))
def test_changing_any_byte_is_refused(valid_files: dict[str, bytes], which: str, position: float,
                                      replacement: int) -> None:
    data = bytearray(valid_files[which])
    index = int(position * len(data))
    if data[index] == replacement:
        replacement = (replacement + 1) % 256
    data[index] = replacement
    assert _refused(bytes(data)), f"byte {index} of {which} changed to {replacement} and still checks"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["orders", "lamp", "orders-signed"]), position=st.floats(0, 1, exclude_max=True),
       bit=st.integers(0, 7))
def test_flipping_any_bit_is_refused(valid_files: dict[str, bytes], which: str, position: float,
                                     bit: int) -> None:
    data = bytearray(valid_files[which])
    index = int(position * len(data))
    data[index] ^= 1 << bit
    assert _refused(bytes(data))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["orders", "orders-signed"]), cut=st.floats(0, 1, exclude_max=True))
def test_truncation_is_unreadable(valid_files: dict[str, bytes], which: str, cut: float) -> None:
    data = valid_files[which]
    with pytest.raises(CertificateUnreadable):
        check_certificate(data[: int(cut * len(data))])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["orders", "orders-signed"]), position=st.floats(0, 1, exclude_max=True),
       inserted=st.binary(min_size=1, max_size=3))
def test_inserting_bytes_is_refused(valid_files: dict[str, bytes], which: str, position: float,
                                    inserted: bytes) -> None:
    data = valid_files[which]
    index = int(position * len(data))
    assert _refused(data[:index] + inserted + data[index:])


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for key in value for p in _leaves(value[key], (*path, key))]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _leaves(item, (*path, i))] or [path]
    return [path]


def _mutated(value: Any, choice: int) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + (1 if choice % 2 else -1)
    if isinstance(value, str):
        return value[:-1] + ("A" if value[-1:] != "A" else "B") if value else "x"
    if value is None:
        return [] if choice % 2 else 0
    if isinstance(value, list):
        return [0]
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["orders", "lamp", "orders-signed"]), pick=st.integers(0, 10**6),
       choice=st.integers(0, 1))
def test_changing_any_field_is_refused(valid_files: dict[str, bytes], which: str, pick: int,
                                       choice: int) -> None:
    document = json.loads(valid_files[which])
    paths = _leaves(document)
    path = paths[pick % len(paths)]
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _mutated(target[path[-1]], choice)
    data = (json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    assert _refused(data), f"changing {'.'.join(map(str, path))} of {which} still checks"


def test_removing_the_signature_is_noticed_when_required(valid_files: dict[str, bytes]) -> None:
    document = json.loads(valid_files["orders-signed"])
    del document["signature"]
    data = (json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    check_certificate(data)  # an unsigned certificate is still a certificate ...
    with pytest.raises(CertificateInvalid):
        check_certificate(data, require_signature=True)  # ... but not when a signature is required


def test_every_byte_position_is_protected(valid_files: dict[str, bytes]) -> None:
    """Exhaustive over positions (hypothesis above samples values): each byte of a signed certificate,
    XORed with a position-dependent non-zero mask, makes the check fail."""
    data = valid_files["orders-signed"]
    accepted = []
    for index in range(len(data)):
        changed = bytearray(data)
        changed[index] ^= 1 + index % 255
        if not _refused(bytes(changed)):
            accepted.append(index)
    assert not accepted, f"changes at byte positions {accepted[:10]} still check"
