"""The `govern` command on hostile or mistaken input: outputs that are inputs, certificates nested too deep,
absurd option values, and --json on every exit path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from govern.certificate._certificate import check_certificate
from govern.certificate._checked import compute_digest
from govern.certificate._composed import check_composed
from govern.certificate._encoding import MAX_NESTING, canonical_json
from govern.certificate._errors import CertificateTooLarge, CertificateUnreadable
from govern.certificate._make import certify
from govern.certificate._signing import load_private_key

from .conftest import MACHINES, govern, orders_registry
from .test_cli import LARGE_MACHINES, govern_all


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
    # Nor over the key's public key, which verifiers pin (`certify --sign ci-key -o ci-key.pub` replaced it
    # with the certificate, and every later `govern check --pubkey ci-key.pub` failed).
    public = (machine_dir / "ci-key.pub").read_bytes()
    done = govern("certify", "shop.py:orders", "--sign", "ci-key", "-o", "ci-key.pub", cwd=machine_dir)
    assert done.returncode == 2 and "signing key's public key" in done.stderr, done.stdout + done.stderr
    assert (machine_dir / "ci-key.pub").read_bytes() == public
    assert (machine_dir / "shop.py").read_bytes() == machine
    assert (machine_dir / "ci-key").read_bytes() == key
    assert not list(machine_dir.glob("*.govern-cert.json"))


def test_a_machine_file_that_changes_directory_moves_no_path_of_the_command(tmp_path: Path) -> None:
    """A machine file with the idiom os.chdir(os.path.dirname(__file__)): -o, --sign and the default output
    keep meaning what they meant when the command started (`-o m.py` overwrote machines/m.py itself, the
    machine file, and --sign looked for the key beside the machine)."""
    (tmp_path / "machines").mkdir()
    text = (
        "import os\nos.chdir(os.path.dirname(os.path.abspath(__file__)))\n"
        "from govern import Registry\nregistry = Registry('orders')\n"
        "status = registry.enum('status', ['pending', 'paid'])\n"
        "registry.event('pay', guard=status == 'pending', effect={status: 'paid'})\n"
    )
    (tmp_path / "machines" / "m.py").write_text(text)
    assert govern("keygen", "ci.key", cwd=tmp_path).returncode == 0
    done = govern("certify", "machines/m.py", "-o", "m.py", "--sign", "ci.key", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "machines" / "m.py").read_text() == text  # the machine file is intact
    assert json.loads((tmp_path / "m.py").read_text())["signature"] is not None  # written where asked
    moved = govern("certify", "machines/m.py", "-o", "machines/m.py", cwd=tmp_path)
    assert moved.returncode == 2 and "refusing to write over it" in moved.stderr
    assert (tmp_path / "machines" / "m.py").read_text() == text
    assert govern("certify", "machines/m.py", cwd=tmp_path).returncode == 0
    assert (tmp_path / "machines" / "orders.govern-cert.json").is_file()  # next to the machine file


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


def test_graph_draws_next_to_a_file_whose_path_holds_a_colon(tmp_path: Path) -> None:
    """`govern graph rel:v2/sub/orders.govern-cert.json` (or the machine file beside it) wrote its drawings
    into the working directory: the directory was taken from the text before the last colon, as if it were
    `PATH:NAME`, though a certificate never takes a name and the path exists as written."""
    sub = tmp_path / "rel:v2" / "sub"
    sub.mkdir(parents=True)
    (sub / "shop.py").write_text(MACHINES)
    certified = govern("certify", "rel:v2/sub/shop.py:orders", cwd=tmp_path)
    assert certified.returncode == 0, certified.stdout + certified.stderr
    for source in ("rel:v2/sub/orders.govern-cert.json", "rel:v2/sub/shop.py", "rel:v2/sub/shop.py:orders"):
        for drawing in sub.glob("orders.events.*"):
            drawing.unlink()
        done = govern("graph", source, cwd=tmp_path)
        assert done.returncode == 0, (source, done.stdout, done.stderr)
        assert list(sub.glob("orders.events.*")), (source, done.stdout)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rel:v2"], source  # nothing drawn here


def _nest(expression: Any, levels: int) -> Any:
    for _ in range(levels):
        expression = ["not", expression]
    return expression


def _deepen(document: dict[str, Any], levels: int) -> bytes:
    """`document` with its first event's first effect expression wrapped in `levels` nots, digest redone."""
    effect = document["machine"]["events"][0]["effect"]
    effect[0][1] = _nest(effect[0][1], levels)
    document["digest"] = compute_digest(document)
    return canonical_json(document) + b"\n"


def test_a_certificate_nested_too_deep_is_unreadable_not_an_internal_error(tmp_path: Path) -> None:
    """Rule expressions nested past the format's limit, in a table, a symbolic and a composed certificate
    (where pydantic used to give up with a bare ValueError): exit 4 from check, check --json, show and
    graph, and CertificateUnreadable from the library."""
    (tmp_path / "large.py").write_text(LARGE_MACHINES)
    made = govern("certify", "large.py", cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    documents = {
        "table": certify(orders_registry()).document(),
        "symbolic": json.loads((tmp_path / "limits.govern-cert.json").read_bytes()),
        "composed": json.loads((tmp_path / "rooms.govern-cert.json").read_bytes()),
    }
    for kind, document in documents.items():
        data = _deepen(document, 300)  # past pydantic's ~255 levels, below the json module's ~1000
        (tmp_path / f"{kind}.json").write_bytes(data)
        with pytest.raises(CertificateUnreadable, match="nested more than"):
            (check_composed if kind == "composed" else check_certificate)(data)
        for command in (("check",), ("check", "--json"), ("show",), ("graph", "-o", "pictures")):
            (tmp_path / "pictures").mkdir(exist_ok=True)
            done = govern(*command, f"{kind}.json", cwd=tmp_path)
            assert done.returncode == 4, (kind, command, done.stdout, done.stderr)
            assert "internal error" not in done.stderr
            if "--json" in command:
                assert json.loads(done.stdout)["reason"] == "unreadable"
            else:
                assert "nested more than" in done.stderr, (kind, command, done.stderr)


def test_a_missing_input_file_is_exit_4_in_every_command_naming_the_path(machine_dir: Path) -> None:
    """Every input path of every `govern` command (machine file, certificate, signing key, public key) that
    does not exist is "not found", exit 4 as in `bide-audit` and docs/cli.md (it was 2), and the message
    names the path. A machine file that exists and does not import stays exit 2."""
    (machine_dir / "orders.json").write_bytes(certify(orders_registry()).to_bytes())
    (machine_dir / "broken.py").write_text("from govern import Registry\nr = Registry('x'\n")
    (machine_dir / "folder").mkdir()
    missing = {
        ("certify", "gone.py"): "gone.py",
        ("certify", "gone.py:orders", "--json"): "gone.py",
        ("certify", "folder"): "folder",
        ("certify", "shop.py:orders", "--no-write", "--sign", "gone-key"): "gone-key",
        ("check", "gone.json"): "gone.json",
        ("check", "orders.json", "--pubkey", "gone-key.pub"): "gone-key.pub",
        ("show", "gone.json"): "gone.json",
        ("graph", "gone.json"): "gone.json",
        ("graph", "gone.py:orders"): "gone.py",
    }
    *results, broken = govern_all(*missing, ("certify", "broken.py"), cwd=machine_dir)
    for (args, path), done in zip(missing.items(), results, strict=True):
        assert done.returncode == 4, (args, done.stdout, done.stderr)
        assert path in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)  # one line
        if "--json" in args:
            assert json.loads(done.stdout)["exit_code"] == 4
    assert broken.returncode == 2 and "syntax error" in broken.stderr, broken.stderr
    assert sorted(p.name for p in machine_dir.iterdir()) == [
        "broken.py", "divergent.py", "folder", "orders.json", "shop.py"
    ]


def _deep_guard_machine(name: str, nots: int) -> str:
    """A machine file whose one guard is `a >= 5` under `nots` negations, built with the declaration API.
    Two integers of 2 * 10^9 values each: verified symbolically, so no proof-derived rules checker (which
    reads expressions at most 120 deep) stands between the build and the certificate."""
    return (
        "from govern import Registry\n"
        f"registry = Registry({name!r})\n"
        "a = registry.int('a', 0, 2 * 10**9)\n"
        "b = registry.int('b', 0, 2 * 10**9)\n"
        "guard = a >= 5\n"
        f"for _ in range({nots}):\n"
        "    guard = ~guard\n"
        "registry.event('floor', guard=guard, effect={b: 1000})\n"
    )


def test_certify_refuses_a_machine_whose_certificate_could_not_be_read_back(tmp_path: Path) -> None:
    """A guard nested 236 to 254 levels deep was certified into a file `govern check` cannot read (its
    reader stops at MAX_NESTING levels: exit 4); deeper, pydantic gave up with an internal error. Now
    certify measures as the reader does: the deepest machine it certifies reads back and checks, one level
    more is an input error (exit 2) naming the event, with nothing written."""
    # The guard's array is at level 5 of the certificate; `a >= 5` adds 2 levels, each negation one.
    deepest = MAX_NESTING - 5 - 1
    depths = {"fits": deepest, "one_more": deepest + 1, "reported": 250, "past_pydantic": 300}
    for name, nots in depths.items():
        (tmp_path / f"{name}.py").write_text(_deep_guard_machine(name, nots))
    fits, *refused = govern_all(*(("certify", f"{name}.py") for name in depths), cwd=tmp_path)
    assert fits.returncode == 0, fits.stdout + fits.stderr
    checked = govern("check", "fits.govern-cert.json", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for name, done in zip(list(depths)[1:], refused, strict=True):
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert "event 'floor'" in done.stdout and "too deep for a certificate" in done.stdout, done.stdout
        assert "internal error" not in done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*(f"{name}.py" for name in depths), "fits.govern-cert.json"]
    )
    namespace: dict[str, Any] = {}
    exec(_deep_guard_machine("library", deepest + 1), namespace)
    with pytest.raises(CertificateTooLarge, match="1 level too deep"):
        certify(namespace["registry"])


def _wide_isin_machine(name: str, values: int) -> str:
    """A machine file over one enum of 130 labels whose one guard is `status.isin(...)` over `values`
    labels: an isin() nests one `or` per value, so the guard is `values` operators deep."""
    return (
        "from govern import Registry\n"
        f"registry = Registry({name!r})\n"
        "labels = [f's{i}' for i in range(130)]\n"
        "status = registry.enum('status', labels)\n"
        f"registry.event('close', guard=status.isin(labels[1:{values + 1}]), effect={{status: 's0'}})\n"
    )


def test_a_rule_deeper_than_the_rules_checker_reads_is_an_input_error_not_a_bug(tmp_path: Path) -> None:
    """An enumerated machine is re-checked by the proof-derived rules checker, which reads expressions at
    most 120 operators deep. An isin() over 121 labels used to end the build in OracleUnavailable, which
    `govern certify` reports as an internal error (exit 3, "a bug"); it is now a declaration error (exit 2)
    naming the rule and how to split it, with nothing written. At the limit the machine certifies."""
    for name, values in {"fits": 120, "wide": 121}.items():
        (tmp_path / f"{name}.py").write_text(_wide_isin_machine(name, values))
    fits, wide = govern_all(("certify", "fits.py"), ("certify", "wide.py"), cwd=tmp_path)
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert wide.returncode == 2, wide.stdout + wide.stderr
    out = wide.stdout + wide.stderr
    assert "guard of event 'close' nests 121 operators deep" in out and "x.isin(" in out, out
    assert "internal error" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fits.govern-cert.json", "fits.py", "wide.py"]


def test_a_huge_clock_skew_is_a_usage_error(machine_dir: Path) -> None:
    """`--max-clock-skew` past any sane value used to overflow the date arithmetic (exit 3)."""
    assert govern("keygen", "ci-key", cwd=machine_dir).returncode == 0
    made = govern("certify", "shop.py:orders", "--sign", "ci-key", "-o", "signed.json", cwd=machine_dir)
    assert made.returncode == 0, made.stderr
    done = govern("check", "signed.json", "--max-clock-skew", "999999999999", cwd=machine_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "at most" in done.stderr and "internal error" not in done.stderr
    century = str(100 * 366 * 24 * 3600)
    assert govern("check", "signed.json", "--max-clock-skew", century, cwd=machine_dir).returncode == 0
    over = govern("check", "signed.json", "--max-clock-skew", str(int(century) + 1), cwd=machine_dir)
    assert over.returncode == 2, over.stdout + over.stderr


def test_the_library_accepts_any_clock_skew(machine_dir: Path) -> None:
    """A skew past the calendar's end allows any signing date rather than overflowing."""
    assert govern("keygen", "ci-key", cwd=machine_dir).returncode == 0
    signed = certify(orders_registry()).signed(load_private_key(machine_dir / "ci-key"))
    result = check_certificate(signed.to_bytes(), max_clock_skew=1e15)
    assert result.signature is not None


CRASH = (
    "import sys\n"
    "import govern.certificate._certificate as certificates\n"
    "from govern.cli._main import main\n"
    "def crash(*args, **kwargs):\n"
    "    raise RuntimeError('simulated bug')\n"
    "certificates.check_certificate = crash\n"
    "sys.exit(main(['check', '--json', sys.argv[1]]))\n"
)


def test_check_json_prints_one_document_on_every_exit(machine_dir: Path) -> None:
    """`govern check --json` prints a JSON document for a missing file (exit 4) and an internal error
    (exit 3), as it does for exits 0, 1 and 4."""
    missing = govern("check", "--json", "nowhere.json", cwd=machine_dir)
    assert missing.returncode == 4, missing.stdout + missing.stderr
    document = json.loads(missing.stdout)
    assert document["exit_code"] == 4 and document["valid"] is False and "nowhere.json" in document["message"]
    assert govern("certify", "shop.py:orders", "-o", "orders.json", cwd=machine_dir).returncode == 0
    crashed = subprocess.run([sys.executable, "-c", CRASH, "orders.json"], cwd=machine_dir,
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 3, crashed.stdout + crashed.stderr
    document = json.loads(crashed.stdout)
    assert document["exit_code"] == 3 and document["valid"] is False
    assert document["reason"] == "internal error" and "simulated bug" in document["message"]


def test_keygen_onto_a_directory_is_a_key_error_and_writes_nothing(tmp_path: Path) -> None:
    """`govern keygen .` was an internal error (exit 3); `keygen k --force` with a directory at k.pub
    wrote the private key and then failed."""
    (tmp_path / "k.pub").mkdir()
    (tmp_path / "sub").mkdir()
    for args in (["keygen", "."], ["keygen", "sub"], ["keygen", "k", "--force"]):
        result = govern(*args, cwd=tmp_path)
        assert result.returncode == 2 and "is a directory" in result.stderr, (args, result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pub", "sub"]


def test_what_a_machine_file_prints_does_not_spoil_the_json_document(machine_dir: Path) -> None:
    """A machine file that prints at import put its text before `certify --json`'s document on stdout."""
    (machine_dir / "noisy.py").write_text('print("loading machine")\n' + MACHINES)
    result = govern("certify", "noisy.py:orders", "--json", cwd=machine_dir)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["exit_code"] == 0 and "loading machine" in result.stderr



def _registries(**names: str) -> str:
    """A machine file with one small convergent registry per keyword: variable name = registry name."""
    lines = ["from govern import Registry", ""]
    for attribute, name in names.items():
        lines += [f"{attribute} = Registry({name!r})", f"on_{attribute} = {attribute}.bool('on')",
                  f"{attribute}.event('switch_on', effect={{on_{attribute}: True}})", ""]
    return "\n".join(lines)


def test_two_registries_that_would_write_one_file_are_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """`govern certify` names each certificate after its registry, so a second registry with the same name
    silently replaced the first one's certificate (and its drawings). Now both are named, exit 2, and
    nothing is written or replaced; so for names that differ only in case (one file on macOS) or in
    characters a file name does not keep."""
    (tmp_path / "same.py").write_text(_registries(first="lights", second="lights"))
    (tmp_path / "case.py").write_text(_registries(upper="Lights", lower="lights"))
    (tmp_path / "chars.py").write_text(_registries(spaced="garden lights", joined="garden_lights"))
    (tmp_path / "lights.govern-cert.json").write_bytes(b"an earlier certificate\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    same, same_json, drawn, case, chars, unwritten, one = govern_all(
        ("certify", "same.py"),
        ("certify", "same.py:lights", "--json"),  # NAME matching both registries' name
        ("graph", "same.py"),
        ("certify", "case.py"),
        ("certify", "chars.py", "--no-write", "--graph"),
        ("certify", "same.py", "--no-write"),  # nothing written: nothing to refuse
        ("certify", "same.py:second", "-o", "second.json"),
        cwd=tmp_path,
    )
    for refused, first, second, file in (
        (same, "first", "second", "lights.govern-cert.json"),
        (drawn, "first", "second", "lights.events.dot"),
        (case, "upper", "lower", "lights.govern-cert.json"),
        (chars, "spaced", "joined", "garden_lights.events.dot"),
    ):
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"'{first}'" in refused.stderr and f"'{second}'" in refused.stderr, refused.stderr
        assert file in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "take one at a time: govern certify same.py:second -o FILE" in same.stderr
    document = json.loads(same_json.stdout)
    assert same_json.returncode == 2 and document["exit_code"] == 2 and "'second'" in document["message"]
    assert unwritten.returncode == 0, unwritten.stdout + unwritten.stderr
    assert one.returncode == 0, one.stdout + one.stderr
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after.pop("second.json").startswith(b'{"digest":')
    assert after == before


def test_a_machine_file_that_is_not_text_is_a_syntax_error_without_a_none_line(tmp_path: Path) -> None:
    """A NUL byte gives a SyntaxError without a line number: the message said "nul.py:None: syntax
    error". Bytes that are not UTF-8 name their line."""
    (tmp_path / "nonutf8.py").write_bytes(b'x = "\xff\xfe"\n')
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    for name in ("nonutf8.py", "nul.py"):
        done = govern("certify", name, cwd=tmp_path)
        assert done.returncode == 2 and "syntax error" in done.stderr, done.stderr
        assert ":None" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_machine_file_that_ends_the_process_while_imported_is_not_certified(tmp_path: Path) -> None:
    """os._exit(0) in a machine file (or posix._exit, or an exec replacing the process) made `govern
    certify` exit 0 ("certified") with no output and no certificate, so a CI gate on it passed; sys.exit(0)
    was already refused."""
    files = {
        "hard.py": ("import os\nos._exit(0)\n", "os._exit(0)"),
        "posix.py": ("import posix\nposix._exit(0)\n", "os._exit(0)"),
        "early.py": ("from os import _exit\n_exit(0)\n", "os._exit(0)"),
        "exec.py": ("import os\nos.execv('/bin/true', ['true'])\n", "os.execv(...)"),
        "soft.py": ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
    }
    for name, (text, _) in files.items():
        (tmp_path / name).write_text(text)
    for name, (_, call) in files.items():
        done = govern("certify", name, cwd=tmp_path)
        assert done.returncode == 2 and f"called {call} while being imported" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)


def test_a_process_a_machine_file_forks_ends_as_it_would_and_certify_reports_once(tmp_path: Path) -> None:
    """A machine file that ran a helper in a forked process (multiprocessing) while imported: the helper's
    own os._exit(0) raised there, as the file's would, so govern's error path ran on in the child: stdout
    held a second JSON document ("the file called os._exit(0)", exit_code 2) beside the real report, and
    the file saw its helper exit 2. The child ends as it would now; only the process govern runs in is
    guarded."""
    (tmp_path / "shop.py").write_text(
        "import multiprocessing, sys\nfrom govern import Registry\n"
        "def warm():\n    pass\n"
        "p = multiprocessing.get_context('fork').Process(target=warm)\np.start()\np.join()\n"
        "print('helper exit code', p.exitcode, file=sys.stderr)\n"
        "r = Registry('shop')\nx = r.int('x', 0, 3)\nr.event('inc', guard=x < 3, effect={x: x + 1})\n"
    )
    done = govern("certify", "shop.py", "--json", "-o", "shop.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exit_code"] == 0  # one document: a second would not parse
    assert "helper exit code 0" in done.stderr and "os._exit" not in done.stderr, done.stderr
    assert check_certificate((tmp_path / "shop.json").read_bytes()).rules_checked  # raises unless valid


def test_a_machine_file_that_closes_its_stdout_still_gets_its_error_said(tmp_path: Path) -> None:
    """A machine file's stdout is govern's stderr while it runs: its `sys.stdout.close()` closed that, and
    its import error then could not be said: exit 1 ("not convergent"), and no JSON document with --json."""
    (tmp_path / "m.py").write_text(
        "import sys\nfrom govern import Registry\nr = Registry('m')\nx = r.bool('x')\n"
        "r.event('on', effect={x: True})\nsys.stdout.close()\nraise ValueError('a bad machine file')\n"
    )
    for extra in ([], ["--json"]):
        done = govern("certify", "m.py", *extra, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "importing the file raised ValueError: a bad machine file" in done.stderr
        if extra:
            assert json.loads(done.stdout)["exit_code"] == 2


def test_certify_refuses_to_write_over_a_private_key(machine_dir: Path) -> None:
    """`govern certify m.py -o KEY` without `--sign` (so the key is no input) replaced the private key with
    the certificate, exit 0: a key nothing can make again. Refused (exit 2), the key kept."""
    assert govern("keygen", "ci-key", cwd=machine_dir).returncode == 0
    key = (machine_dir / "ci-key").read_bytes()
    machine = next(p.name for p in machine_dir.glob("*.py"))
    done = govern("certify", machine, "-o", "ci-key", cwd=machine_dir)
    assert done.returncode == 2 and "ci-key holds a private key" in done.stderr, done.stderr
    assert (machine_dir / "ci-key").read_bytes() == key


def _with_guard(body: str) -> str:
    """A machine file whose one event's guard is a Python function with `body` (run while it is built)."""
    return (
        "import asyncio, os, sys\nfrom govern import Registry\nr = Registry('m')\na = r.bool('a')\n"
        f"def guard(s):\n    {body}\n    return True\n"
        "r.event('flip', guard=guard, effect={a: True})\n"
    )


def test_a_rule_that_ends_the_process_or_prints_while_the_machine_is_built_is_the_files_fault(
    tmp_path: Path,
) -> None:
    """The import of a machine file was guarded, not its callable rules, which run while the machine is
    built: a guard calling sys.exit(0) or os._exit(0) made `certify --json`, `certify --no-write` and
    `graph` exit 0 with no certificate and no output (a CI gate passed); one raising CancelledError was a
    traceback and exit 1 ("not convergent"); one printing spoiled the JSON document; one changing directory
    moved where -o wrote. They are input errors (exit 2) now, as at import, and the rest stays put."""
    files = {
        "soft.py": ("sys.exit(0)", "called sys.exit(0)"),
        "hard.py": ("os._exit(0)", "called os._exit(0)"),
        "cancel.py": ("raise asyncio.CancelledError('x')", "raised CancelledError"),
    }
    for name, (body, _) in files.items():
        (tmp_path / name).write_text(_with_guard(body))
    (tmp_path / "noisy.py").write_text(_with_guard("print('checking', s)"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "moves.py").write_text(_with_guard("os.chdir(os.path.dirname(__file__) + '/elsewhere')"))
    for name, (_, said) in files.items():
        for command in (["certify", name, "--json"], ["certify", name, "--no-write"], ["graph", name]):
            done = govern(*command, cwd=tmp_path)
            assert done.returncode == 2, (command, done.stdout, done.stderr)
            assert f"{said} while the machine was built" in done.stdout + done.stderr, (command, done)
            if "--json" in command:
                assert json.loads(done.stdout)["exit_code"] == 2
    noisy = govern("certify", "noisy.py", "--json", "-o", "noisy.json", cwd=tmp_path)
    assert noisy.returncode == 0 and json.loads(noisy.stdout)["exit_code"] == 0, noisy.stdout
    assert "checking" in noisy.stderr
    moves = govern("certify", "moves.py", "-o", "out.json", cwd=tmp_path)
    assert moves.returncode == 0, moves.stderr
    assert (tmp_path / "out.json").is_file() and not (tmp_path / "elsewhere" / "out.json").exists()
    expected = {*files, "noisy.py", "moves.py", "noisy.json", "out.json", "elsewhere"}
    assert {p.name for p in tmp_path.iterdir()} == expected  # no certificate of the failed ones, no drawing


def test_show_renders_a_certificate_naming_events_it_does_not_have(tmp_path: Path) -> None:
    """`govern show` renders a certificate as written and `govern check` judges it: a verdict naming an
    event index the machine does not have (its digest recomputed, so it reads) is shown with the index
    marked, and is not valid (exit 1). `show` failed on it with exit 3, "internal error, a bug"."""
    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "certs" / "orders.govern-cert.json").read_text())
    doc["verdict"]["not_idempotent"][0] = 3
    doc["verdict"]["causal_order_obligations"][0][0] = 2**63
    doc["digest"] = compute_digest(doc)
    (tmp_path / "odd.json").write_bytes(canonical_json(doc) + b"\n")
    shown = govern("show", "odd.json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "#3 (no such entry)" in shown.stdout and f"#{2**63} (no such entry)" in shown.stdout
    checked = govern("check", "odd.json", cwd=tmp_path)
    assert checked.returncode == 1 and "not valid" in checked.stdout + checked.stderr


def test_graph_output_that_is_a_file_says_so(tmp_path: Path) -> None:
    """`govern graph CERT -o FILE` named an existing file "no such directory"."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "cert.json").write_bytes((root / "certs" / "orders.govern-cert.json").read_bytes())
    done = govern("graph", "cert.json", "-o", "cert.json", cwd=tmp_path)
    assert done.returncode == 2 and "cert.json is not a directory" in done.stderr, done.stderr
    missing = govern("graph", "cert.json", "-o", "nowhere", cwd=tmp_path)
    assert missing.returncode == 2 and "nowhere: no such directory" in missing.stderr


_UNPRINTABLE = (
    "class Unprintable(Exception):\n    def __str__(self):\n        raise RuntimeError('no text')\n\n"
)


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            _UNPRINTABLE + "raise Unprintable()\n",
            "importing the file raised Unprintable: (a Unprintable whose text cannot be made)",
        ),
        (
            _UNPRINTABLE + "from govern import Registry\nr = Registry('cb')\na = r.bool('a')\n\n"
            "def guard(state):\n    raise Unprintable()\n\nr.event('on', guard=guard, effect={a: True})\n",
            "guard raised Unprintable: (a Unprintable whose text cannot be made)",
        ),
        (
            "from govern import Registry\nr = Registry('cb')\na = r.bool('a')\n\n"
            "class Opaque:\n    def __repr__(self):\n        raise RuntimeError('no repr')\n\n"
            "r.event('on', guard=lambda state: Opaque(), effect={a: True})\n",
            "is not deterministic: it returned (a Opaque whose text cannot be made)",
        ),
    ],
    ids=["import", "rule-raises", "rule-returns"],
)
def test_a_machine_files_object_without_text_is_the_files_error_not_govern(
    tmp_path: Path, source: str, said: str
) -> None:
    """An exception whose __str__ raises, or a value whose __repr__ does, made govern report a bug of its own
    (exit 3, "internal error"), pointing the user at govern instead of their file."""
    (tmp_path / "m.py").write_text(source)
    done = govern("certify", "m.py", "--no-write", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    shown = " ".join((done.stdout + done.stderr).split())
    assert said in shown and "internal error" not in shown


def test_a_machine_file_that_lowers_the_recursion_limit_is_certified(tmp_path: Path) -> None:
    """sys.setrecursionlimit(50) in a machine file made govern's own checks fail afterwards (exit 3)."""
    (tmp_path / "m.py").write_text(
        "import sys\nsys.setrecursionlimit(50)\nfrom govern import Registry\nregistry = Registry('orders')\n"
        "status = registry.enum('status', ['pending', 'paid'])\n"
        "registry.event('pay', guard=status == 'pending', effect={status: 'paid'})\n"
    )
    done = govern("certify", "m.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert govern("check", "orders.govern-cert.json", cwd=tmp_path).returncode == 0


def test_a_rule_that_raises_is_reported_over_several_lines_as_written(tmp_path: Path) -> None:
    """A rule's error names the rule and the state it met on lines of their own: the message's line breaks
    were printed as the escape `\\x0a`, so the three lines ran together into one."""
    (tmp_path / "raises.py").write_text(
        "from govern import Registry\nregistry = Registry('x')\na = registry.bool('a')\n"
        "registry.event('e', guard=lambda s: 1 / 0 == 0, effect={a: True})\n"
    )
    done = govern("certify", "raises.py", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert any("raised ZeroDivisionError" in line for line in lines), lines
    assert any(line.strip().startswith("rule:") for line in lines), lines
    assert any(line.strip().startswith("state:") for line in lines), lines
    assert "\\x0a" not in done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raises.py"]


def test_a_composed_format_nested_in_a_table_certificate_is_read_as_the_table_it_is(tmp_path: Path) -> None:
    """`govern check` told a composed certificate by searching the whole text for its format member, so a
    table certificate holding that member in a nested object was read as a composed one and refused for
    lacking components. Only the top-level format decides: the CLI says what the table reader says."""
    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "certs" / "orders.govern-cert.json").read_text())
    doc["oracle"]["note"] = {"format": "govern-certificate/composed-1"}
    doc["digest"] = compute_digest(doc)
    data = canonical_json(doc) + b"\n"
    (tmp_path / "odd.json").write_bytes(data)
    with pytest.raises(CertificateUnreadable) as raised:
        check_certificate(data)
    checked = govern("check", "odd.json", cwd=tmp_path)
    assert checked.returncode == 4, checked.stdout + checked.stderr
    assert str(raised.value) in " ".join((checked.stdout + checked.stderr).split())
    assert "composed" not in checked.stdout + checked.stderr
