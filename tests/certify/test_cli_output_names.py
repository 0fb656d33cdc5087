"""`govern certify` and `govern graph` on names the file system or the certificate format cannot take, and
on a machine file over the size limit: input errors with a message, never an internal error, and nothing
written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import govern as govern_api

from .test_cli import govern_all

#: One character, two bytes in UTF-8: 130 of them make a name of 130 characters (a certificate takes 200)
#: and 260 bytes (more than the 255 a file name has on Linux file systems).
WIDE = "é" * 130
LONG = "a" * 300


def _machine(name: str, *, event: str = "on") -> str:
    return (
        "from govern import Registry\n"
        f"r = Registry({name!r})\n"
        "x = r.bool('x')\n"
        f"r.event({event!r}, effect={{x: True}})\n"
    )


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_an_output_name_too_long_for_the_file_system_is_an_input_error(tmp_path: Path) -> None:
    """A default certificate or drawing name longer than the file system takes (a long registry name), or an
    `-o` too long, or under a directory whose name is too long: exit 2 naming the path, nothing written. The
    file system's "File name too long" came out of Path.exists() and was reported as a bug (exit 3)."""
    (tmp_path / "wide.py").write_text(_machine(WIDE))
    (tmp_path / "short.py").write_text(_machine("orders"))
    before = _listing(tmp_path)
    calls = {
        ("certify", "wide.py"): f"{WIDE}.govern-cert.json",
        ("certify", "wide.py", "--json"): f"{WIDE}.govern-cert.json",
        ("certify", "short.py", "-o", f"{LONG}.json"): f"{LONG}.json",
        ("certify", "short.py", "-o", f"{LONG}/orders.json"): LONG,
        ("graph", "short.py", "-o", LONG): LONG,
        ("graph", "wide.py"): f"{WIDE}.events",
        ("certify", "wide.py", "--no-write", "--graph"): f"{WIDE}.events",
    }
    for (args, name), done in zip(calls.items(), govern_all(*calls, cwd=tmp_path), strict=True):
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        said = done.stdout + done.stderr
        assert name in said and "File name too long" in said, (args, said)
        assert "internal error" not in said and "Traceback" not in said, (args, said)
        if "--json" in args:
            assert json.loads(done.stdout)["exit_code"] == 2
    assert _listing(tmp_path) == before


def test_a_name_longer_than_a_certificate_holds_is_an_input_error(tmp_path: Path) -> None:
    """A registry or event name over the certificate format's 200 characters is legal in a registry, but
    its certificate could not be read back: `govern.certify` raises CertificateTooLarge saying which name,
    and `govern certify` and `govern graph` exit 2 with that message (they reported a bug, exit 3)."""
    (tmp_path / "machine.py").write_text(_machine("r" * 250))
    (tmp_path / "event.py").write_text(_machine("orders", event="e" * 201))
    before = _listing(tmp_path)
    for done, name in zip(
        govern_all(
            ("certify", "machine.py", "-o", "out.json"),
            ("graph", "machine.py"),
            ("certify", "event.py", "-o", "out.json"),
            cwd=tmp_path,
        ),
        ("machine name 'rrrr", "machine name 'rrrr", "event name 'eeee"),
        strict=True,
    ):
        assert done.returncode == 2, done.stdout + done.stderr
        assert name in done.stdout + done.stderr and "at most 200 characters" in done.stdout + done.stderr
        assert "internal error" not in done.stdout + done.stderr
    assert _listing(tmp_path) == before
    registry = govern_api.Registry("lights")
    on = registry.bool("on")
    registry.event("x" * 201, effect={on: True})
    with pytest.raises(govern_api.CertificateTooLarge, match=r"event name 'xxx.*201 characters"):
        govern_api.certify(registry)


def test_a_machine_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """`govern certify` and `govern graph` read a machine file only up to `--max-size` (default 256 MiB, as
    for certificates): a larger one is exit 4 naming the limit, before it is imported (a sparse file of
    terabytes was read whole)."""
    sparse = tmp_path / "huge.py"
    with sparse.open("wb") as handle:
        handle.truncate(256 * 1024 * 1024 + 1)  # sparse: takes no disk
    (tmp_path / "small.py").write_text(_machine("orders"))
    default, limited, graph, fits = govern_all(
        ("certify", "huge.py"),
        ("certify", "small.py", "--max-size", "10", "--json"),
        ("graph", "small.py", "--max-size", "10"),
        ("certify", "small.py", "--max-size", "10000", "--no-write"),
        cwd=tmp_path,
    )
    assert default.returncode == 4, default.stdout + default.stderr
    assert "268435457 bytes, over the 268435456-byte limit" in default.stderr, default.stderr
    assert limited.returncode == 4 and json.loads(limited.stdout)["exit_code"] == 4, limited.stdout
    assert "over the 10-byte limit" in json.loads(limited.stdout)["message"]
    assert graph.returncode == 4 and "over the 10-byte limit" in graph.stderr, graph.stderr
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert sorted(os.listdir(tmp_path)) == ["huge.py", "small.py"]


def test_a_certificate_named_as_one_of_its_drawings_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """`certify -o NAME.events.dot --graph` wrote the certificate, then its drawing over it, and said
    "certified" of a file `check` could not read; `-o DIR/` wrote a file named DIR (and `-o good.json/`
    replaced good.json). Each is exit 2 now, nothing written and a file already there unchanged."""
    (tmp_path / "base.py").write_text(_machine("lights"))
    (tmp_path / "good.json").write_text("kept\n")
    before = _listing(tmp_path)
    calls = [
        ("certify", "base.py", "-o", name, "--graph")
        for name in ("lights.events.mmd", "lights.events.dot", "lights.states.dot", "LIGHTS.events.svg",
                     "lights.component1.states.png")
    ] + [("certify", "base.py", "-o", name) for name in ("newdir/", "good.json/")]
    for args, done in zip(calls, govern_all(*calls, cwd=tmp_path), strict=True):
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        said = done.stderr
        assert "Traceback" not in said, (args, said)
        assert ("drawings" in said) if "--graph" in args else ("not a file name" in said), (args, said)
    assert _listing(tmp_path) == before
    assert not (tmp_path / "newdir").exists()
    # A name that only looks like a drawing of another machine is a certificate name like any other.
    done = govern_all(("certify", "base.py", "-o", "other.events.dot", "--graph"), cwd=tmp_path)[0]
    assert done.returncode == 0, done.stderr
    assert govern_all(("check", "other.events.dot"), cwd=tmp_path)[0].returncode == 0
