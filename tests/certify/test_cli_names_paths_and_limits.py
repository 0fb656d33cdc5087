"""The `govern` command on names, paths and limits it failed on, through subprocesses: a name that is not
valid text, a machine file whose name is not UTF-8, a --max-size of a tebibyte, a composed certificate
naming positions it does not have, modules planted beside a certificate under `python -m govern`,
crossed variable and registry names, and Ctrl-C after one of two certificates was written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from govern import Registry
from govern.certificate._checked import compute_digest
from govern.certificate._encoding import canonical_json
from govern.certificate._make import certify

from .conftest import MACHINES, govern, orders_registry
from .test_cli import _CTRL_C

TEBIBYTE = str(2**40)


def test_a_name_that_is_not_valid_text_is_an_input_error_not_a_bug(tmp_path: Path) -> None:
    """An event named "go\\ud800" ran the whole build, then failed digesting the rules: exit 3, "a bug"."""
    (tmp_path / "lone.py").write_text(
        'from govern import Registry\nr = Registry("orders")\nx = r.bool("x")\n'
        'r.event("go\\ud800", effect={x: True})\n'
    )
    done = govern("certify", "lone.py", "--no-write", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "not valid text" in done.stderr and "lone surrogate" in done.stderr
    assert "internal error" not in done.stderr


def test_a_machine_file_whose_name_is_not_utf8_is_certified_and_drawn(tmp_path: Path) -> None:
    """`certify m\\xff.py` and `graph m\\xff.py` failed with exit 3 naming the module after the path."""
    name = os.fsdecode(b"m\xff.py")
    (tmp_path / name).write_text(MACHINES)
    certified = govern("certify", f"{name}:orders", cwd=tmp_path)
    assert certified.returncode == 0, certified.stderr
    assert (tmp_path / "orders.govern-cert.json").is_file()
    drawn = govern("graph", f"{name}:orders", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "orders.events.dot").is_file()


def test_a_max_size_of_a_tebibyte_reads_only_what_is_there(tmp_path: Path) -> None:
    """--max-size up to 1 TiB is documented; check, show and graph allocated the whole limit before reading
    (MemoryError, exit 3)."""
    (tmp_path / "cert.json").write_bytes(certify(orders_registry()).to_bytes())
    (tmp_path / "drawings").mkdir()
    for args in (("check",), ("show",), ("graph", "-o", "drawings")):
        done = govern(*args[:1], "cert.json", *args[1:], "--max-size", TEBIBYTE, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stderr)


def test_graph_draws_a_composed_certificate_naming_positions_it_does_not_have(tmp_path: Path) -> None:
    """As `show` does: a component listing variable or event position 99 (digest recomputed) was exit 3,
    an IndexError; it is drawn marked, and `check` finds it not valid."""
    rooms = Registry("rooms")
    for room in ("hall", "den"):
        on = rooms.bool(f"{room}_on")
        rooms.event(f"{room}_switch", effect={on: True})
    document = certify(rooms.build(compose=True)).document()
    document.pop("signature", None)
    document["components"][0]["variables"].append(99)
    document["components"][0]["events"].append(98)
    document["digest"] = compute_digest(document)
    (tmp_path / "odd.json").write_bytes(canonical_json(document) + b"\n")
    (tmp_path / "drawings").mkdir()
    drawn = govern("graph", "odd.json", "-o", "drawings", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    events = next((tmp_path / "drawings").glob("rooms.events.*")).read_text()  # Mermaid or DOT
    dot = (tmp_path / "drawings" / "rooms.events.dot").read_text()
    for text in (events, dot):
        assert "#99 (no such entry)" in text and "#98 (no such entry)" in text
    checked = govern("check", "odd.json", cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr


# Modules `govern check` imports after it starts, each planted beside a certificate.
PLANTED = ("rich", "json", "argparse", "numpy", "pydantic", "cryptography", "hashlib", "signal")


def test_python_m_govern_imports_nothing_planted_beside_the_certificate(tmp_path: Path) -> None:
    """`python -m` puts the working directory first on sys.path: a rich.py beside a garbage certificate
    made `python -m govern check` exit 0 without checking anything."""
    (tmp_path / "cert.json").write_text("not a certificate\n")
    for module in PLANTED:
        (tmp_path / f"{module}.py").write_text(
            f"import sys\nsys.stderr.write('planted {module} ran\\n')\nraise SystemExit(0)\n"
        )
    for args in (("check", "cert.json"), ("check", "cert.json", "--json"), ("show", "cert.json")):
        done = govern(*args, cwd=tmp_path)  # `python -m govern`, from the certificate's directory
        assert done.returncode == 4, (args, done.stdout, done.stderr)
        assert "planted" not in done.stderr
    (tmp_path / "cert.json").write_bytes(certify(orders_registry()).to_bytes())
    valid = govern("check", "cert.json", cwd=tmp_path)
    assert valid.returncode == 0 and "planted" not in valid.stderr, valid.stderr


def test_importing_the_govern_package_loads_only_govern_and_bide() -> None:
    """What `python -m govern` imports before govern/__main__.py takes the working directory off sys.path
    is the package `govern` itself: it must load no module another directory could provide (no third-party
    package, no standard module the interpreter has not loaded already)."""
    probe = (
        "import sys\nbefore = set(sys.modules)\nimport govern\n"
        "print(sorted(m for m in set(sys.modules) - before if m.partition('.')[0] not in ('govern', 'bide')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


CROSSED = """\
from govern import Registry
a = Registry("b")
b = Registry("a")
for r in (a, b):
    x = r.bool("x")
    r.event("go", effect={x: True})
"""


def test_path_variable_selects_the_registry_bound_to_that_variable(tmp_path: Path) -> None:
    """With `a = Registry("b")` and `b = Registry("a")`, `f.py:a` selected both registries (one by its
    variable's name, the other by its own), so `-o` was refused although a PATH:NAME was given."""
    (tmp_path / "f.py").write_text(CROSSED)
    for variable, registry in (("a", "b"), ("b", "a")):
        done = govern("certify", f"f.py:{variable}", "-o", f"{variable}.json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        document = json.loads((tmp_path / f"{variable}.json").read_text())
        assert document["machine"]["name"] == registry
    listed = govern("certify", "f.py:a", "--json", "--no-write", cwd=tmp_path)
    assert [r["name"] for r in json.loads(listed.stdout)["results"]] == ["b"]


def test_a_registry_name_two_registries_share_is_ambiguous_for_o(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text(CROSSED.replace('Registry("a")', 'Registry("b")'))
    done = govern("certify", "f.py:b", "-o", "one.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # the variable b
    twice = CROSSED.replace('Registry("b")', 'Registry("x")').replace('Registry("a")', 'Registry("x")')
    (tmp_path / "g.py").write_text(twice)
    refused = govern("certify", "g.py:x", "-o", "two.json", cwd=tmp_path)
    assert refused.returncode == 2
    for said in ("ambiguous", "'a', 'b'", "PATH:VARIABLE"):
        assert said in refused.stderr, refused.stderr
    assert not (tmp_path / "two.json").exists()


def test_ctrl_c_after_a_certificate_was_written_says_it_was(tmp_path: Path) -> None:
    """Interrupted while building the second of two registries, `certify --json` said `"results": []`,
    though the first certificate was written."""
    (tmp_path / "two.py").write_text(
        "import os, signal, govern\n"
        "first = govern.Registry('first')\nx = first.bool('x')\nfirst.event('go', effect={x: True})\n"
        "second = govern.Registry('second')\ny = second.bool('y')\n"
        f"def guard(state):\n    {_CTRL_C}\n    return True\n"
        "second.event('go', guard=guard, effect={y: True})\n"
    )
    done = govern("certify", "two.py", "--json", cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    document = json.loads(done.stdout)
    assert document["reason"] == "interrupted"
    [first] = document["results"]
    assert (first["name"], first["status"]) == ("first", "certified")
    assert Path(first["certificate"]).name == "first.govern-cert.json"
    assert "first.govern-cert.json" in document["message"]
    assert (tmp_path / "first.govern-cert.json").is_file()
    assert not (tmp_path / "second.govern-cert.json").exists()
    human = govern("certify", "two.py", cwd=tmp_path)
    assert human.returncode == 130 and "first.govern-cert.json" in human.stderr, human.stderr
