"""What `govern` writes when the disk fills up: a certificate, a key pair, drawings. Each is refused with a
clear message and exit 2 (an output that cannot be written, as in `bide-audit`), never an internal error,
and leaves no file half-written, no key without its other half, and every file that was there unchanged.
On a real 64 KiB tmpfs (see `small_disk`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import MACHINES, PAGE, SmallDisk, govern

pytestmark = pytest.mark.slow


def _files(directory: Path) -> dict[str, bytes]:
    """Every file in `directory` (temporary ones included) with its content, but the disk's filler."""
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.name != ".filler"}


@pytest.fixture
def machines(tmp_path: Path) -> Path:
    """A directory off the small disk holding the machine file `shop.py`."""
    folder = tmp_path / "machines"
    folder.mkdir()
    (folder / "shop.py").write_text(MACHINES)
    return folder


def test_a_certificate_that_does_not_fit_is_a_usage_error_and_the_old_one_stays(
    small_disk: SmallDisk, machines: Path
) -> None:
    old = small_disk.path / "orders.json"
    old.write_bytes(b"the certificate of yesterday\n")
    small_disk.fill(0)
    done = small_disk.run("govern", "certify", "shop.py:orders", "-o", str(old), cwd=machines)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot write" in done.stdout and "No space left on device" in done.stdout, done.stdout
    assert "internal error" not in done.stdout + done.stderr
    assert _files(small_disk.path) == {"orders.json": b"the certificate of yesterday\n"}


def test_a_key_pair_that_does_not_fit_is_a_key_error_and_leaves_no_half_pair(
    small_disk: SmallDisk, tmp_path: Path
) -> None:
    """Room for one key file only: `govern keygen` wrote the private key and failed on its .pub."""
    small_disk.fill(PAGE)
    done = small_disk.run("govern", "keygen", str(small_disk.path / "ci-key"), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert _files(small_disk.path) == {}
    assert "No space left on device" in done.stderr and "no key file was written" in done.stderr
    # bide-audit answers the same disk the same way (docs/cli.md: one table for all three commands).
    audit = small_disk.run("bide-audit", "keygen", str(small_disk.path / "log-key"), cwd=tmp_path)
    assert audit.returncode == 2, audit.stdout + audit.stderr
    assert "No space left on device" in audit.stdout + audit.stderr
    assert _files(small_disk.path) == {}


@pytest.mark.parametrize("disk", ["tmpfs", "fsync fails"])
def test_a_forced_key_pair_that_does_not_fit_keeps_the_old_pair(
    small_disk: SmallDisk, tmp_path: Path, disk: str
) -> None:
    """`keygen --force` over an existing pair writes both new files before replacing either: when they do
    not fit, the old pair stays, whole and matching. The same for `bide-audit keygen --force`, which
    replaced the private key first and, when its .pub could not be written, removed it: no private key at
    all. ("fsync fails": in-process, the disk reports ENOSPC when the second new file is flushed, freeing
    nothing meanwhile; on the tmpfs, the old private key's page was freed by the rename, so the .pub fit.)"""
    if disk == "fsync fails":
        small_disk = SmallDisk(tmp_path / "simulated", mounted=False)
        small_disk.path.mkdir()
    for prog in ("govern", "bide-audit"):
        key = small_disk.path / f"{prog}-key"
        small_disk.fill(8 * PAGE)
        made = small_disk.run(prog, "keygen", str(key), cwd=tmp_path)
        assert made.returncode == 0, made.stdout + made.stderr
        before = _files(small_disk.path)
        small_disk.fill(PAGE)  # room for one new key file, not two
        done = small_disk.run(prog, "keygen", str(key), "--force", cwd=tmp_path)
        assert done.returncode == 2, (prog, done.stdout, done.stderr)
        assert "No space left on device" in done.stdout + done.stderr
        assert _files(small_disk.path) == before, prog


def test_drawings_that_do_not_fit_are_a_usage_error_and_none_is_left(
    small_disk: SmallDisk, machines: Path
) -> None:
    """`govern graph` into a full directory was an internal error (exit 3) that left the first drawing
    written and the others not; `certify --graph` wrote the certificate, then failed the same way."""
    small_disk.fill(PAGE)  # one drawing fits, the machine has four (or more, with Graphviz)
    drawn = small_disk.run("govern", "graph", "shop.py:orders", "-o", str(small_disk.path), cwd=machines)
    assert drawn.returncode == 2, drawn.stdout + drawn.stderr
    assert "cannot write the drawings of 'orders'" in drawn.stderr and "No space left" in drawn.stderr
    assert "no drawing was written" in drawn.stderr and "internal error" not in drawn.stderr
    assert _files(small_disk.path) == {}

    small_disk.fill(3 * PAGE)  # the certificate (two pages) and one drawing
    output = small_disk.path / "orders.json"
    certified = small_disk.run("govern", "certify", "shop.py:orders", "-o", str(output), "--graph", "--json",
                               cwd=machines)
    assert certified.returncode == 2, certified.stdout + certified.stderr
    assert "internal error" not in certified.stdout + certified.stderr
    report = json.loads(certified.stdout)["results"][0]
    assert report["status"] == "input-error" and "cannot write the drawings" in report["message"]
    assert report["certificate"] == str(output)  # the certificate is whole, and kept
    assert sorted(_files(small_disk.path)) == ["orders.json"]
    check = small_disk.run("govern", "check", str(output), cwd=machines)
    assert check.returncode == 0, check.stdout + check.stderr


def test_certify_refuses_to_replace_what_is_not_a_regular_file(machines: Path) -> None:
    """`-o` naming a pipe (or a device: `-o /dev/null` run as root) replaced it with a certificate file."""
    os.mkfifo(machines / "pipe")
    done = govern("certify", "shop.py:orders", "-o", "pipe", cwd=machines)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not a regular file" in done.stderr
    assert (machines / "pipe").is_fifo()
