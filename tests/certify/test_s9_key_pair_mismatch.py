"""`govern certify --sign KEY` signs only with a key whose `.pub` beside it is its own public half: a keygen
killed between writing the two files (or another .pub put there) leaves a pair whose certificates would not
verify with the key checkers pin, and that pair is refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import govern


def test_certify_refuses_a_private_key_whose_pub_is_another_keys(machine_dir: Path) -> None:
    assert govern("keygen", "-o", "ci-key", cwd=machine_dir).returncode == 0
    assert govern("keygen", "-o", "other", cwd=machine_dir).returncode == 0
    own_pub = (machine_dir / "ci-key.pub").read_bytes()
    (machine_dir / "ci-key.pub").write_bytes((machine_dir / "other.pub").read_bytes())

    refused = govern("certify", "shop.py:orders", "--sign", "ci-key", cwd=machine_dir)

    assert refused.returncode == 2, refused.stderr
    said = " ".join(refused.stderr.split())
    assert "not a pair" in said and "govern keygen --force" in said
    assert said.count("ed25519:") >= 2  # both keys named
    assert not (machine_dir / "orders.govern-cert.json").exists()

    # Its own .pub put back: it signs, and the certificate checks with that .pub.
    (machine_dir / "ci-key.pub").write_bytes(own_pub)
    assert govern("certify", "shop.py:orders", "--sign", "ci-key", cwd=machine_dir).returncode == 0
    checked = govern("check", "orders.govern-cert.json", "--pubkey", "ci-key.pub", cwd=machine_dir)
    assert checked.returncode == 0, checked.stderr
    assert json.loads((machine_dir / "orders.govern-cert.json").read_text())["signature"]


def test_a_keygen_killed_between_its_two_files_leaves_a_pair_certify_refuses_until_keygen_runs_again(
    machine_dir: Path,
) -> None:
    """`keygen --force` over a pair, killed between its two renames (the private key's done, the .pub's
    not): the process stops itself at its second rename (an audit hook in a wrapper, nothing in govern
    patched) and is SIGKILLed there."""
    assert govern("keygen", "-o", "k", cwd=machine_dir).returncode == 0
    old_pub = (machine_dir / "k.pub").read_bytes()
    wrapper = textwrap.dedent(
        """
        import os, signal, sys
        renames = []
        def hook(event, args):
            if event == "os.rename":
                renames.append(args)
                if len(renames) == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
        sys.addaudithook(hook)
        from govern.cli._main import main
        sys.exit(main(["keygen", "-o", "k", "--force"]))
        """
    )
    killed = subprocess.run([sys.executable, "-c", wrapper], cwd=machine_dir, capture_output=True)
    assert killed.returncode == -9, killed.stderr
    assert (machine_dir / "k.pub").read_bytes() == old_pub  # the new private key beside the old .pub

    refused = govern("certify", "shop.py:orders", "--sign", "k", cwd=machine_dir)
    assert refused.returncode == 2 and "not a pair" in " ".join(refused.stderr.split()), refused.stderr
    assert not (machine_dir / "orders.govern-cert.json").exists()

    assert govern("keygen", "-o", "k", "--force", cwd=machine_dir).returncode == 0
    assert govern("certify", "shop.py:orders", "--sign", "k", cwd=machine_dir).returncode == 0
    checked = govern("check", "orders.govern-cert.json", "--pubkey", "k.pub", cwd=machine_dir)
    assert checked.returncode == 0, checked.stderr
