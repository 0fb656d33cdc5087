"""`govern` at its edges: a machine file that raises a BaseException that is not an Exception at import
(exit 2, one JSON document with --json, no traceback), a public key passed to --sign (named as such, before
any "chmod 600" advice), an unknown registry name (the error lists every name that selects one), and
--json documents with their keys sorted (docs/cli.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import MACHINES, govern

RAISES = '''\
import asyncio
from govern import Registry

r = Registry("lights")
a = r.bool("a")
r.event("a_on", effect={a: True})
raise ERROR
'''


@pytest.mark.parametrize("error", ['asyncio.CancelledError("setup cancelled")', "BaseException('odd')"])
@pytest.mark.parametrize("command", ["certify", "graph"])
def test_a_machine_file_raising_a_base_exception_at_import_does_not_import(
    error: str, command: str, tmp_path: Path
) -> None:
    (tmp_path / "machine.py").write_text(RAISES.replace("ERROR", error))
    plain = govern(command, "machine.py", cwd=tmp_path)
    assert plain.returncode == 2, plain.stderr
    assert "Traceback" not in plain.stderr and "importing the file raised" in plain.stderr
    if command == "graph":
        return
    as_json = govern(command, "machine.py", "--json", cwd=tmp_path)
    assert as_json.returncode == 2, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["exit_code"] == 2 and "importing the file raised" in document["message"]


def test_a_public_key_given_to_sign_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "machines.py").write_text(MACHINES)
    assert govern("keygen", "ci-key", cwd=tmp_path).returncode == 0
    (tmp_path / "ci-key.pub").chmod(0o644)
    result = govern("certify", "machines.py:orders", "--sign", "ci-key.pub", cwd=tmp_path)
    assert result.returncode == 2
    assert "is a public key" in result.stderr and "private key file it was made beside" in result.stderr
    assert "chmod" not in result.stderr


def test_an_unknown_registry_name_lists_every_name_that_selects_one(tmp_path: Path) -> None:
    (tmp_path / "machines.py").write_text(MACHINES.replace('Registry("lamp")', 'Registry("the-lamp")'))
    result = govern("certify", "machines.py:nope", cwd=tmp_path)
    assert result.returncode == 2
    assert "lamp, orders, the-lamp" in result.stderr
    assert govern("certify", "machines.py:the-lamp", "--json", cwd=tmp_path).returncode == 0


def _keys_sorted(text: str) -> bool:
    def walk(x: object) -> bool:
        if isinstance(x, dict):
            return list(x) == sorted(x) and all(walk(v) for v in x.values())
        if isinstance(x, list):
            return all(walk(v) for v in x)
        return True

    return walk(json.loads(text))


def test_json_documents_have_their_keys_sorted(tmp_path: Path) -> None:
    (tmp_path / "machines.py").write_text(MACHINES)
    certified = govern("certify", "machines.py:orders", "--json", cwd=tmp_path)
    assert certified.returncode == 0, certified.stderr
    assert _keys_sorted(certified.stdout)
    [cert] = tmp_path.glob("*.govern-cert.json")
    checked = govern("check", cert.name, "--json", cwd=tmp_path)
    assert checked.returncode == 0 and _keys_sorted(checked.stdout)
    cert.write_text("{}")
    refused = govern("check", cert.name, "--json", cwd=tmp_path)
    assert refused.returncode != 0 and _keys_sorted(refused.stdout)
