"""The `govern` command end to end, through a subprocess: real exit codes, files and output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from govern._errors import OracleDisagreement
from govern.certificate._checked import compute_digest
from govern.certificate._encoding import canonical_json
from govern.certificate._make import certify
from govern.cli._main import main

from .conftest import MACHINES, govern, lamp_registry, orders_registry
from .test_certificate import forge, forged_divergent_certificate

CERTS = ("orders.govern-cert.json", "lamp.govern-cert.json")


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the certificates `govern certify shop.py` writes, made once for the tests that only
    read them (each govern call costs about a second of interpreter start)."""
    folder = tmp_path_factory.mktemp("certified")
    (folder / "shop.py").write_text(MACHINES)
    result = govern("certify", "shop.py", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


def copy_certs(certified: Path, machine_dir: Path) -> None:
    for name in CERTS:
        shutil.copy(certified / name, machine_dir / name)


def govern_all(*calls: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """`govern(*args)` for each of `calls`, all at once: for commands that do not depend on each other
    (the same CPU work; a free core makes it faster)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: govern(*args, cwd=cwd), calls))


def test_help_documents_every_exit_code(tmp_path: Path) -> None:
    result = govern("--help", cwd=tmp_path)
    assert result.returncode == 0
    for line in ("0  success", "machine not convergent (govern certify", "2  usage or input error",
                 "3  internal error or engine/oracle disagreement", "4  unreadable or not found: a truncated",
                 "certificate not valid (govern check)"):
        assert line in result.stdout
    for command in ("certify", "check", "show", "keygen", "graph"):
        assert command in result.stdout
    assert "exit codes" in govern("check", "--help", cwd=tmp_path).stdout


def test_certify_writes_a_certificate_per_registry_that_checks(machine_dir: Path) -> None:
    result = govern("certify", "shop.py", cwd=machine_dir)
    assert result.returncode == 0, result.stderr
    assert "certified orders" in result.stdout and "certified lamp" in result.stdout
    for name in ("orders", "lamp"):
        path = machine_dir / f"{name}.govern-cert.json"
        assert path.is_file()
        checked = govern("check", path.name, cwd=machine_dir)
        assert checked.returncode == 0, checked.stderr
        assert "valid" in checked.stdout and "Verified" in checked.stdout
    lamp = govern("check", "lamp.govern-cert.json", cwd=machine_dir).stdout
    assert "not checked offline" in " ".join(lamp.split())


def test_certify_is_reproducible_byte_for_byte(machine_dir: Path) -> None:
    assert govern("certify", "shop.py:orders", "-o", "a.json", cwd=machine_dir).returncode == 0
    assert govern("certify", "shop.py:orders", "-o", "b.json", cwd=machine_dir).returncode == 0
    assert (machine_dir / "a.json").read_bytes() == (machine_dir / "b.json").read_bytes()


def test_certify_json_report(machine_dir: Path) -> None:
    result = govern("certify", "shop.py:orders", "--json", "--no-write", cwd=machine_dir)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["exit_code"] == 0
    [entry] = report["results"]
    assert entry["status"] == "certified" and entry["rules_checked"] is True
    assert entry["verdict"]["states"] == 48 and entry["digest"].startswith("sha256:")
    assert not (machine_dir / "orders.govern-cert.json").exists()


def test_not_convergent_exits_1_with_a_counterexample(machine_dir: Path) -> None:
    result = govern("certify", "divergent.py", cwd=machine_dir)
    assert result.returncode == 1
    assert "not convergent" in result.stdout
    assert "turn_on" in result.stdout and "turn_off" in result.stdout and "order 1" in result.stdout
    assert not (machine_dir / "switch.govern-cert.json").exists()
    as_json = json.loads(govern("certify", "divergent.py", "--json", cwd=machine_dir).stdout)
    assert as_json["exit_code"] == 1 and as_json["results"][0]["counterexample"]["condition"] == "CC1"


def test_input_errors_exit_2_without_traceback(machine_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (machine_dir / "broken.py").write_text("from govern import Registry\nr = Registry('x'\n")
    (machine_dir / "empty.py").write_text("x = 1\n")
    (machine_dir / "raises.py").write_text("raise RuntimeError('boom')\n")
    cases = {
        ("certify", "broken.py"): "syntax error",
        ("certify", "empty.py"): "no Registry",
        ("certify", "raises.py"): "RuntimeError: boom",
        ("certify", "shop.py:nosuch"): "no registry named 'nosuch'",
        ("certify", "shop.py", "-o", "one.json"): "defines 2 registries",
        ("certify", "shop.py:orders", "-o", "nodir/one.json"): "does not exist",
        ("frobnicate",): "invalid choice",
    }
    through_subprocess = {("certify", "broken.py")}
    here = os.getcwd()
    os.chdir(machine_dir)
    try:
        for args, message in cases.items():
            if args in through_subprocess:
                result = govern(*args, cwd=machine_dir)
                code, stderr = result.returncode, result.stderr
            else:  # the same main(), in-process: faster, and the exit code is its return value
                try:
                    code = main(list(args))
                except SystemExit as exc:  # argparse usage errors
                    code = int(str(exc.code))
                stderr = capsys.readouterr().err
            assert code == 2, (args, stderr)
            assert message in stderr, (args, stderr)
            assert "Traceback" not in stderr
    finally:
        os.chdir(here)
    debug = govern("--debug", "certify", "raises.py", cwd=machine_dir)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_keygen_sign_and_check_with_a_public_key(machine_dir: Path) -> None:
    result = govern("keygen", "-o", "ci-key", cwd=machine_dir)
    assert result.returncode == 0, result.stderr
    private, public = machine_dir / "ci-key", machine_dir / "ci-key.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in private.read_bytes() and b"PUBLIC KEY" in public.read_bytes()
    assert not [p for p in machine_dir.iterdir() if p.name.endswith(".tmp")]
    before = private.read_bytes()
    again = govern("keygen", "-o", "ci-key", cwd=machine_dir)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert private.read_bytes() == before
    assert govern("keygen", "-o", "other", cwd=machine_dir).returncode == 0

    assert govern("certify", "shop.py:orders", "--sign", "ci-key", cwd=machine_dir).returncode == 0
    cert = "orders.govern-cert.json"
    document = json.loads((machine_dir / cert).read_text())
    assert document["signature"]["key_id"].startswith("ed25519:")
    ok = govern("check", cert, "--pubkey", "ci-key.pub", cwd=machine_dir)
    assert ok.returncode == 0 and "signed by ed25519:" in " ".join(ok.stdout.split())  # wrapped statement
    statement = ok.stdout.split("\n\n", 1)[1]
    assert max(len(line) for line in statement.splitlines()) <= 88  # a paragraph, not one 900-character line
    wrong = govern("check", cert, "--pubkey", "other.pub", cwd=machine_dir)
    assert wrong.returncode == 1 and "not by the key given" in wrong.stderr

    assert govern("certify", "shop.py:orders", "-o", "unsigned.json", cwd=machine_dir).returncode == 0
    required = govern("check", "unsigned.json", "--require-signature", cwd=machine_dir)
    assert required.returncode == 1 and "not signed" in required.stderr
    assert govern("check", "unsigned.json", cwd=machine_dir).returncode == 0

    os.chmod(private, 0o644)
    loose = govern("certify", "shop.py:orders", "--sign", "ci-key", cwd=machine_dir)
    assert loose.returncode == 2 and "chmod 600" in loose.stderr


def test_check_distinguishes_unreadable_from_invalid(machine_dir: Path, certified: Path) -> None:
    good = (certified / "orders.govern-cert.json").read_bytes()
    (machine_dir / "good.json").write_bytes(good)
    document = json.loads(good)

    def write(name: str, data: bytes) -> str:
        (machine_dir / name).write_bytes(data)
        return name

    unreadable = {
        "truncated": good[: len(good) // 2],
        "pretty": json.dumps(document, indent=2).encode() + b"\n",
        "unknown-field": good.replace(b'{"digest"', b'{"comment":"hi","digest"', 1),
        "duplicate": good.replace(b'{"digest"', b'{"format":"x","digest"', 1),
        "wrong-type": good.replace(b'"cc1":true', b'"cc1":1', 1),
        "bad-base64": good.replace(b'"apply":"', b'"apply":"!', 1),
    }
    invalid = {
        "digest": good.replace(document["digest"][-6:].encode(), b"000000", 1),
        "verdict": good.replace(b'"max_repair_depth":1', b'"max_repair_depth":2', 1),
    }
    *checked, oversized = govern_all(
        *(("check", write(name + ".json", data)) for name, data in unreadable.items()),
        *(("check", write(name + ".json", data), "--json") for name, data in invalid.items()),
        ("check", "good.json", "--max-size", "100"),
        cwd=machine_dir,
    )
    for name, result in zip(unreadable, checked[: len(unreadable)], strict=True):
        assert result.returncode == 4, (name, result.stdout, result.stderr)
        assert "unreadable" in result.stderr
    assert oversized.returncode == 4 and "limit" in oversized.stderr
    for name, result in zip(invalid, checked[len(unreadable) :], strict=True):
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        assert json.loads(result.stdout)["valid"] is False


def test_show_renders_rules_for_people(machine_dir: Path, certified: Path) -> None:
    copy_certs(certified, machine_dir)
    (machine_dir / "junk.json").write_text("{}")
    result, lamp, junk = govern_all(
        ("show", "orders.govern-cert.json"), ("show", "lamp.govern-cert.json"), ("show", "junk.json"),
        cwd=machine_dir,
    )
    assert result.returncode == 0, result.stderr
    for text in ("status != 'shipped' or paid", "status = 'pending'", "status == 'pending'",
                 "status = 'paid', paid = True", "stock = stock + 1", "pay/restock", "ship/restock",
                 "0 .. 5", "pending, paid, shipped, cancelled", "coq_version"):
        assert text in result.stdout, text
    assert "Python callable" in lamp.stdout and "no: Python callables" in lamp.stdout
    assert junk.returncode == 4


def test_graph_writes_dot_and_mermaid_or_svg(machine_dir: Path, certified: Path) -> None:
    out = machine_dir / "pictures"
    out.mkdir()
    result = govern("graph", "shop.py:orders", "-o", "pictures", cwd=machine_dir)
    assert result.returncode == 0, result.stderr
    events = (out / "orders.events.dot").read_text()
    assert 'graph "orders events"' in events and "e0 -- e2;" in events and "style=dashed" in events
    states = (out / "orders.states.dot").read_text()
    assert "digraph" in states and "status='pending'" in states and "pay" in states
    if (out / "orders.events.svg").exists():
        assert (out / "orders.events.svg").read_text().lstrip().startswith("<?xml")
    else:
        assert (out / "orders.events.mmd").read_text().startswith("flowchart LR")
        assert "-->" in (out / "orders.states.mmd").read_text()
    # From a certificate, and with the state graph left out for size.
    copy_certs(certified, machine_dir)
    small = govern("graph", "orders.govern-cert.json", "-o", "pictures", "--state-limit", "3",
                   cwd=machine_dir)
    assert small.returncode == 0 and "state graph left out" in small.stdout
    assert govern("certify", "shop.py:lamp", "--graph", cwd=machine_dir).returncode == 0
    assert (machine_dir / "lamp.events.dot").exists()


def test_graph_png_without_graphviz_is_refused_and_writes_nothing(machine_dir: Path, tmp_path: Path) -> None:
    """--png without Graphviz exited 0 having drawn no PNG (and said only that SVG was replaced)."""
    bare = tmp_path / "bin"  # a PATH holding this Python and no `dot`
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    out = machine_dir / "pictures"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "govern", "graph", "shop.py:orders", "--png", "-o", "pictures"],
        cwd=machine_dir, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": str(bare), "COLUMNS": "200", "NO_COLOR": "1"},
    )  # fmt: skip
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--png needs Graphviz" in result.stderr and list(out.iterdir()) == []


def test_graph_with_a_directory_in_the_way_replaces_no_drawing(machine_dir: Path) -> None:
    """A set of drawings is written whole or not at all: with one of its names taken by a directory, the
    renames stopped there and three old drawings were already replaced."""
    out = machine_dir / "pictures"
    out.mkdir()
    assert govern("graph", "shop.py:orders", "-o", "pictures", cwd=machine_dir).returncode == 0
    drawings = sorted(p for p in out.iterdir())
    for path in drawings:
        path.write_text("OLD")
    in_the_way = drawings[-1]
    in_the_way.unlink()
    in_the_way.mkdir()
    result = govern("graph", "shop.py:orders", "-o", "pictures", cwd=machine_dir)
    assert result.returncode == 2 and "is not a regular file" in result.stderr, result.stderr
    assert [p.read_text() for p in drawings[:-1]] == ["OLD"] * (len(drawings) - 1)
    assert in_the_way.is_dir()


def test_graph_of_a_bad_machine_is_an_input_error_not_a_bug(tmp_path: Path) -> None:
    (tmp_path / "counter.py").write_text(
        "from govern import Registry\n"
        "r = Registry('counter')\n"
        "n = r.int('n', 0, 3)\n"
        "r.event('inc', effect={n: n + 1})\n"
    )
    for command in ("certify", "graph"):
        result = govern(command, "counter.py", cwd=tmp_path)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "domain violation" in result.stdout + result.stderr
        assert "bug in govern" not in result.stdout + result.stderr


def test_check_imports_nothing_from_the_certificate(machine_dir: Path, certified: Path) -> None:
    """A certificate naming a module that exists next to it must not get that module imported."""
    copy_certs(certified, machine_dir)
    (machine_dir / "orders.py").write_text("open('IMPORTED', 'w').write('yes')\n")
    probe = (
        "import sys\n"
        "from govern.cli._main import main\n"
        "code = main(['check', 'orders.govern-cert.json'])\n"
        "here = [name for name, m in list(sys.modules.items())\n"
        "        if (getattr(m, '__file__', None) or '').startswith(sys.argv[1])]\n"
        "print(sorted(here), 'orders' in sys.modules)\n"
        "sys.exit(code)\n"
    )
    path = os.pathsep.join(p for p in (str(machine_dir), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", probe, str(machine_dir)], cwd=machine_dir,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[] False"
    assert not (machine_dir / "IMPORTED").exists()


def test_forgeries_are_rejected_by_the_command(machine_dir: Path) -> None:
    """The in-process forgeries of test_certificate.py, checked through the real command."""
    orders = certify(orders_registry())
    lamp = certify(lamp_registry())
    files = {
        "divergent-claims-certified.json": forged_divergent_certificate(),
        "swapped-tables.json": forge(orders, lambda d: d.update(tables=lamp.document()["tables"])),
        "claims-cc2.json": forge(orders, lambda d: d["verdict"].update(cc2=True)),
    }
    for name, data in files.items():
        (machine_dir / name).write_bytes(data)
        result = govern("check", name, cwd=machine_dir)
        assert result.returncode in (1, 4), (name, result.stdout, result.stderr)
        assert result.returncode == (4 if name == "swapped-tables.json" else 1), (name, result.stderr)


def test_an_engine_that_disagrees_with_the_checker_exits_3(
    machine_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Simulate an engine bug (a wrong verdict): the re-check catches it, nothing is written, exit 3."""
    import govern.certificate._make as making

    honest = making._verdict

    def buggy(machine: object) -> dict[str, object]:
        return honest(machine) | {"not_idempotent": []}  # type: ignore[arg-type]

    monkeypatch.setattr(making, "_verdict", buggy)
    monkeypatch.chdir(machine_dir)
    assert main(["certify", "shop.py:orders"]) == 3
    assert "re-checking its certificate failed" in capsys.readouterr().out
    assert not (machine_dir / "orders.govern-cert.json").exists()
    with pytest.raises(OracleDisagreement):
        making.certify(orders_registry())


LARGE_MACHINES = '''
from govern import Registry, max_, min_

limits = Registry("limits")  # 10^9 values: verified symbolically
limit = limits.int("limit", 0, 10**9 - 1)
limits.invariant("at_least_ten", holds=limit >= 10, repair={limit: 10})
limits.event("floor_1k", effect={limit: max_(limit, 1000)})
limits.event("cap_900m", effect={limit: min_(limit, 900_000_000)})

rooms = Registry("rooms")  # 8^16 states: built by components
for i in range(16):
    stage = rooms.int(f"stage{i}", 0, 7)
    rooms.event(f"hold{i}", effect={stage: max_(stage, 1)})
    rooms.event(f"close{i}", effect={stage: 7})
'''


def test_symbolic_and_composed_machines_certify_check_and_draw(tmp_path: Path) -> None:
    """`govern certify --graph` on a symbolic and a composed machine, `govern check` of the symbolic
    certificate (the weaker claim stated), and a tampered one refused."""
    (tmp_path / "large.py").write_text(LARGE_MACHINES)
    made = govern("certify", "large.py", "--graph", cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    text = " ".join(made.stdout.split())
    assert "certified limits" in text and "certified rooms" in text
    assert "rests on CP-SAT" in text and "not enumerated: verified symbolically" in text
    limits = tmp_path / "limits.govern-cert.json"
    assert json.loads(limits.read_bytes())["format"] == "govern-symbolic-certificate/1"
    # Pictures: the symbolic machine's event graph (no tables, no state graph); the composed one's
    # components boxed in one event graph, and a state graph per component.
    assert 'graph "limits events"' in (tmp_path / "limits.events.dot").read_text()
    assert not list(tmp_path.glob("limits.states.*"))
    rooms_events = (tmp_path / "rooms.events.dot").read_text()
    assert rooms_events.count("subgraph cluster_") == 16 and "e0 -- e1;" in rooms_events
    assert "always commute" in rooms_events
    assert len(list(tmp_path.glob("rooms.component*.states.dot"))) == 16
    assert "stage3=" in (tmp_path / "rooms.component3.states.dot").read_text()

    checked = govern("check", limits.name, "--json", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    result = json.loads(checked.stdout)
    assert result["rests_on"].startswith("CP-SAT ") and result["checked_with_solver"]["name"] == "CP-SAT"
    assert result["statement"].startswith("Verified, resting on CP-SAT")

    forged = json.loads(limits.read_bytes())
    forged["verdict"]["max_repair_depth"] = 0  # a verdict the rules do not give
    forged["digest"] = compute_digest(forged)
    (tmp_path / "forged.json").write_bytes(canonical_json(forged) + b"\n")
    refused = govern("check", "forged.json", cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "CP-SAT gives 1" in " ".join(refused.stderr.split())


def test_symbolic_certificates_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`govern show` renders a symbolic certificate; a truncated one is unreadable (exit 4); a symbolic
    machine certified on the reachable domain is checked on that domain."""
    (tmp_path / "large.py").write_text(LARGE_MACHINES)
    target = str(tmp_path / "large.py") + ":limits"
    cert = tmp_path / "limits.json"
    assert main(["certify", target, "-o", str(cert)]) == 0
    capsys.readouterr()
    assert main(["show", str(cert)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "govern-symbolic-certificate/1" in shown and "rests on CP-SAT" in shown and "cap_900m" in shown
    (tmp_path / "cut.json").write_bytes(cert.read_bytes()[:-40])
    assert main(["check", str(tmp_path / "cut.json")]) == 4
    assert main(["show", str(tmp_path / "cut.json")]) == 4
    reach = tmp_path / "limits-reachable.json"
    assert main(["certify", target, "--domain", "reachable", "-o", str(reach)]) == 0
    assert json.loads(reach.read_text())["verdict"]["domain"] == "reachable"
    capsys.readouterr()
    assert main(["check", str(reach)]) == 0
    assert "on every reachable state" in " ".join(capsys.readouterr().out.split())
    (tmp_path / "bad.py").write_text(
        "from govern import Registry, min_\n"
        "spill = Registry('spill')\n"
        "x = spill.int('x', 0, 10**9)\n"
        "spill.event('bump', effect={x: x + 1})\n"
        "racy = Registry('racy')\n"
        "y = racy.int('y', 0, 10**9)\n"
        "racy.event('cap', effect={y: min_(y, 10)})\n"
        "racy.event('add', guard=y <= 100, effect={y: y + 900})\n"
    )
    assert main(["certify", str(tmp_path / "bad.py:spill"), "--no-write"]) == 2  # the machine's fault
    assert "domain violation" in capsys.readouterr().out
    assert main(["certify", str(tmp_path / "bad.py:racy"), "--no-write", "--json"]) == 1
    [racy] = json.loads(capsys.readouterr().out)["results"]
    assert racy["status"] == "not-convergent" and racy["counterexample"]["condition"] == "CC1"


def _guarded_by(body: str, before: str = "") -> str:
    """A machine file whose one event's guard runs `body` (after `before`, at the top of the file)."""
    return (
        f"import os, signal, govern\n{before}"
        "r = govern.Registry('p')\n"
        "b = r.bool('b')\n"
        f"def guard(state):\n    {body}\n    return True\n"
        "r.event('on', guard=guard, effect={b: True})\n"
    )


_CTRL_C = "os.kill(os.getpid(), signal.SIGINT)"  # a real SIGINT, as Ctrl-C sends


def test_a_keyboard_interrupt_the_machine_file_raises_is_an_input_error_not_ctrl_c(tmp_path: Path) -> None:
    """`raise KeyboardInterrupt` in a machine file (at import or in a rule) exited 130, "interrupted", which
    a CI job may retry forever: the file's own code raised it, so it is an input error (2). A real SIGINT
    while the file runs is still 130."""
    (tmp_path / "top.py").write_text("raise KeyboardInterrupt\n")
    (tmp_path / "rule.py").write_text(_guarded_by("raise KeyboardInterrupt"))
    expected = [("top.py", "importing the file raised KeyboardInterrupt"), ("rule.py", "raised KeyboardInt")]
    for name, said in expected:
        done = govern("certify", name, "--no-write", "--json", cwd=tmp_path)
        assert done.returncode == 2, (name, done.stderr)
        document = json.loads(done.stdout)
        if name == "rule.py":  # the file imports: the failure is its registry's
            [document] = document["results"]
        assert document["exit_code"] == 2 and said in document["message"], document
        assert "interrupted" not in done.stderr
    (tmp_path / "signalled.py").write_text(_guarded_by(_CTRL_C))
    assert govern("certify", "signalled.py", "--no-write", cwd=tmp_path).returncode == 130
    # Started with SIGINT ignored (nohup, `cmd &` in a script), no Ctrl-C can come: it is the file's own.
    ignored = subprocess.run(
        [sys.executable, "-m", "govern", "certify", "top.py", "--no-write"], cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert ignored.returncode == 2 and "no Ctrl-C was pressed" in ignored.stderr, ignored.stderr
    # A file that installs its own SIGINT handler: a real Ctrl-C cannot be told from its own raise, and is
    # taken for what it most likely is (it was said "no Ctrl-C was pressed", exit 2).
    handler = "def interrupt(*_):\n    raise KeyboardInterrupt\nsignal.signal(signal.SIGINT, interrupt)\n"
    (tmp_path / "handler.py").write_text(_guarded_by(_CTRL_C, before=handler))
    assert govern("certify", "handler.py", "--no-write", cwd=tmp_path).returncode == 130


def test_json_is_one_document_on_a_usage_error_and_on_an_interrupt(tmp_path: Path) -> None:
    """`check --json` and `certify --json` print one JSON document on every exit: bad arguments (argparse
    printed its usage only) and Ctrl-C (nothing at all) included."""
    refused = govern("check", "any.json", "--json", "--max-clock-skew", "abc", cwd=tmp_path)
    assert refused.returncode == 2
    assert json.loads(refused.stdout) == {
        "exit_code": 2, "reason": "usage error", "valid": False,
        "message": "the arguments were refused: argument --max-clock-skew: 'abc' is not a whole number of "
                   "seconds",
    }  # fmt: skip
    assert "not a whole number of seconds" in refused.stderr
    (tmp_path / "m.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    interrupted = govern("certify", "m.py", "--json", cwd=tmp_path)
    assert interrupted.returncode == 130
    document = json.loads(interrupted.stdout)
    assert (document["exit_code"], document["reason"], document["results"]) == (130, "interrupted", [])
