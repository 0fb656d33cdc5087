"""The `govern` command on hostile or mistaken input: outputs that are inputs, certificates nested too deep,
absurd option values, and --json on every exit path."""

from __future__ import annotations

import os
from pathlib import Path

from govern.certificate._make import certify

from .conftest import govern, orders_registry


def test_certify_refuses_to_write_over_the_machine_file_or_the_key(machine_dir: Path) -> None:
    """`-o` naming the machine file (directly, through a symlink or a hard link) or the signing key is a
    usage error, and both files keep every byte."""
    machine = (machine_dir / "shop.py").read_bytes()
    assert govern("keygen", "ci-key", cwd=machine_dir).returncode == 0
    key = (machine_dir / "ci-key").read_bytes()
    (machine_dir / "link.py").symlink_to("shop.py")
    os.link(machine_dir / "shop.py", machine_dir / "hard.py")
    for output in ("shop.py", "./link.py", "hard.py", "../" + machine_dir.name + "/shop.py"):
        done = govern("certify", "shop.py:orders", "-o", output, cwd=machine_dir)
        assert done.returncode == 2, (output, done.stdout, done.stderr)
        assert "machine file" in done.stderr and "refusing to write over it" in done.stderr
    done = govern("certify", "shop.py:orders", "--sign", "ci-key", "-o", "ci-key", cwd=machine_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "signing key" in done.stderr
    assert (machine_dir / "shop.py").read_bytes() == machine
    assert (machine_dir / "ci-key").read_bytes() == key
    assert not list(machine_dir.glob("*.govern-cert.json"))


def test_graph_of_a_certificate_refuses_to_write_over_it(tmp_path: Path) -> None:
    """`govern graph` writing NAME.events.dot over the certificate it draws: refused, nothing written."""
    cert = tmp_path / "orders.events.dot"
    cert.write_bytes(certify(orders_registry()).to_bytes())
    before = cert.read_bytes()
    # The command reads a certificate only from a .json path; a symlink gives it one to the same file.
    (tmp_path / "orders.json").symlink_to(cert.name)
    done = govern("graph", "orders.json", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refusing to write over it" in done.stderr
    assert cert.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orders.events.dot", "orders.json"]
