"""`Machine.load` on small hostile files: a member whose .npy header declares a huge array, a member that
decompresses to far more than the file holds. Each raises `MachineFileError` without allocating what the
file claims (a 581-byte file raised a bare MemoryError; a 1 MiB file grew the process by a GiB)."""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from symbolic_corpus import limits
from test_govern_build import orders

from govern import Machine, MachineFileError, Registry, max_


def _npy_header(shape: tuple[int, ...], dtype: str = "|u1") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _peak_bytes(load: Callable[[], object]) -> int:
    """The most memory Python and numpy held at once while `load` ran (both report to tracemalloc)."""
    tracemalloc.start()
    try:
        with pytest.raises(MachineFileError):
            load()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_header_declaring_a_huge_array_is_refused_before_it_is_allocated(tmp_path: Path) -> None:
    path = tmp_path / "huge.govern"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("format.npy", _npy_header((17,)) + b"govern.machine.v1")
        archive.writestr("rules.npy", _npy_header((1 << 44,)) + b"x" * 100)  # claims 16 TiB
    with pytest.raises(MachineFileError, match=r"'rules.npy' declares 17592186044416 bytes .* holds 100"):
        Machine.load(path)


def test_a_deflate_bomb_is_refused_before_it_is_decompressed(tmp_path: Path) -> None:
    """64 MiB of zeros compress to 64 KiB: refused by the sizes its members claim, holding no more memory
    than a few times the file's size."""
    path = tmp_path / "bomb.govern"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("rules.npy", _npy_header((64 << 20,)) + bytes(64 << 20))
    assert path.stat().st_size < 1 << 20
    peak = _peak_bytes(lambda: Machine.load(path))
    assert peak < 4 << 20, peak
    with pytest.raises(MachineFileError, match=r"'rules\.npy' is compressed"):
        Machine.load(path)


def test_members_claiming_more_bytes_than_the_file_holds_are_refused(tmp_path: Path) -> None:
    """A stored member whose size in the zip directory is forged to 1 GiB: refused before it is read."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("rules.npy", _npy_header((64,)) + bytes(64))
    data = bytearray(buffer.getvalue())
    entry = data.rindex(b"PK\x01\x02")  # the member's entry in the central directory
    data[entry + 24 : entry + 28] = (1 << 30).to_bytes(4, "little")  # its uncompressed size
    path = tmp_path / "forged.govern"
    path.write_bytes(bytes(data))
    with pytest.raises(MachineFileError, match="members claim more bytes than the file holds"):
        Machine.load(path)


def _composed() -> Registry:
    r = Registry("pair")
    a, b = r.int("a", 0, 3), r.int("b", 0, 3)
    r.event("raise_a", effect={a: max_(a, 2)})
    r.event("raise_b", effect={b: max_(b, 2)})
    return r


@pytest.mark.parametrize(
    "build",
    [lambda: orders().build(), lambda: _composed().build(compose=True), lambda: limits(False).build()],
    ids=["tables", "composed", "symbolic"],
)
def test_a_machine_file_with_compressed_members_is_refused(
    tmp_path: Path, build: Callable[[], Machine]
) -> None:
    """Machine.save stores each array as it is, so a compressed member is no file it wrote: refused for
    every format (table, composed and symbolic machines are read by one reader), though its content is
    intact. The same file stored loads."""
    machine = build()
    saved = tmp_path / "saved.govern"
    machine.save(saved)
    compressed = tmp_path / "compressed.govern"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            target.writestr(member.filename, source.read(member))
    with pytest.raises(MachineFileError, match="is compressed"):
        Machine.load(compressed)
    assert Machine.load(saved, digest=machine.digest).digest == machine.digest


@pytest.mark.parametrize(
    ("member", "problem"),
    [
        (_npy_header((4,), "<i4") + bytes(12), "declares 16 bytes of data but holds 12"),
        (_npy_header((2,), "<i4") + bytes(12), "declares 8 bytes of data but holds 12"),
        (_npy_header((3,), "|O") + bytes(24), "not numbers"),
        (_npy_header((1,), "<f8") + bytes(8), "not numbers"),
    ],
    ids=["short", "long", "objects", "floats"],
)
def test_a_member_whose_header_does_not_describe_its_bytes_is_refused(
    tmp_path: Path, member: bytes, problem: str
) -> None:
    path = tmp_path / "odd.govern"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("format.npy", _npy_header((17,)) + b"govern.machine.v1")
        archive.writestr("repair.npy", member)
    with pytest.raises(MachineFileError, match=problem):
        Machine.load(path)
