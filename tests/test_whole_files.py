"""A file written whole (`bide._files.write_whole`: evidence packages, heads, proofs, keys, anchors) leaves
nothing behind when its writer is killed in the middle: no partial hidden temporary file per try, for
SIGKILL and for a SIGTERM the program does not handle (what `timeout`, systemd and `docker stop` send)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import bide._files
from bide._files import write_whole

ROOT = Path(__file__).resolve().parents[1]
SIZE = 128 << 20  # long enough to write and fsync that a kill 50 ms in lands in the middle
WRITER = (
    "import sys; from pathlib import Path; from bide._files import write_whole; "
    "data = b'x' * int(sys.argv[2]); print('writing', flush=True); "
    "write_whole(Path(sys.argv[1]), data); print('done', flush=True)"
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_writer_killed_mid_write_leaves_no_file_behind(sig: signal.Signals, tmp_path: Path) -> None:
    target = tmp_path / "evidence.json"
    for _ in range(5):  # a machine fast enough to finish first tries again (the file is then whole)
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target), str(SIZE)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline() == "writing\n"
        time.sleep(0.05)
        child.send_signal(sig)
        out, _ = child.communicate(timeout=60)
        left = sorted(p.name for p in tmp_path.iterdir())
        if "done" in out:
            assert left == [target.name] and target.stat().st_size == SIZE
            target.unlink()
            continue
        assert child.returncode == -sig
        assert left == [], f"left behind by a writer killed with {sig.name}: {left}"
        return
    pytest.fail("the writer finished before every kill: make SIZE larger")


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    not hasattr(os, "O_TMPFILE"),
    reason="O_TMPFILE exists on Linux only; elsewhere every write goes through a named temporary file",
)
def test_on_linux_a_file_gets_a_name_only_once_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes go to an unnamed file, which is linked under a temporary name only once whole and fsynced:
    never to a named temporary file that a kill during the write would leave. On kernels where a link
    through /proc/self/fd fails (EXDEV), every write fell back to the named one."""

    def named_temporary_file(*args: object, **kwargs: object) -> tuple[int, Path]:
        raise AssertionError("written to a named temporary file")

    monkeypatch.setattr(bide._files, "_created_named", named_temporary_file)
    target = tmp_path / "evidence.json"
    write_whole(target, b"{}\n")
    assert target.read_bytes() == b"{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_an_output_that_is_a_symlink_is_written_through_when_it_is_the_users_own(tmp_path: Path) -> None:
    """`govern certify -o LINK` (LINK pointing at the deployed certificate) replaced the link by a regular
    file and left the deployed one stale, with exit 0. The file the link leads to is written now (a dangling
    link's target is created); a link owned by another user is not written through (a link planted in a
    shared directory must not redirect the write): exit 2, nothing changed."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    deployed = deploy / "current.json"
    deployed.write_text('{"old": true}')
    (tmp_path / "ledger.json").symlink_to("deploy/current.json")
    (tmp_path / "dangling.json").symlink_to("deploy/next.json")
    machine = REPO / "examples" / "ledger.py"

    def certify(output: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "govern", "certify", str(machine), "-o", output]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)

    done = certify("ledger.json")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ledger.json").is_symlink() and deployed.read_text().startswith('{"digest":')
    assert certify("dangling.json").returncode == 0
    assert (tmp_path / "dangling.json").is_symlink()
    assert (deploy / "next.json").read_text() == deployed.read_text()

    planted = tmp_path / "planted.json"
    planted.symlink_to("deploy/current.json")
    os.lchown(planted, 65534, 65534)  # nobody's link (the tests run as root)
    before = deployed.read_bytes()
    refused = certify("planted.json")
    assert refused.returncode == 2, refused.stderr
    assert "symbolic link owned by another user" in refused.stderr + refused.stdout
    assert planted.is_symlink() and deployed.read_bytes() == before
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["dangling.json", "deploy", "ledger.json", "planted.json"]


_KEY = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"


@pytest.mark.parametrize(
    "text",
    [
        _KEY,
        "\n" + _KEY,  # a blank first line
        _KEY.replace("\n", "\r\n"),
        "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"  # openssl ecparam
        + _KEY.replace("PRIVATE KEY", "EC PRIVATE KEY"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n" + _KEY,  # a bundle, the key after
        "Bag Attributes\n    localKeyID: 01 \n" + _KEY,  # openssl pkcs12 -nodes
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbg==\n-----END OPENSSH PRIVATE KEY-----\n",
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    ],
    ids=["pkcs8", "blank-first-line", "crlf", "ec-parameters-first", "certificate-first", "pkcs12", "openssh",
         "encrypted"],
)
def test_an_output_that_holds_a_private_key_is_refused(tmp_path: Path, text: str) -> None:
    """The check read a file's first line only: OpenSSL's files with EC parameters, a certificate or bag
    attributes before the key (and a key after a blank line) were written over."""
    from bide._errors import ConfigError
    from bide._files import check_output

    key = tmp_path / "k.pem"
    key.write_bytes(text.encode())
    with pytest.raises(ConfigError, match="holds a private key"):
        check_output(str(key))
    assert key.read_bytes() == text.encode()


def test_an_artifact_quoting_a_key_or_a_public_key_is_not_taken_for_a_key(tmp_path: Path) -> None:
    from bide._files import check_output, private_key_refusal

    quoted = tmp_path / "evidence.json"
    quoted.write_text(json.dumps({"records": [{"result": _KEY}]}, indent=2))
    public = tmp_path / "k.pub"
    public.write_text("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert not any(private_key_refusal(p) for p in (quoted, public, fifo, tmp_path / "absent"))
    check_output(str(quoted))
    check_output(str(public))


def test_a_command_started_with_standard_streams_closed_keeps_those_descriptors_from_its_files() -> None:
    """`bide worker >&-`: descriptor 1 was free, a PostgreSQL connection was opened as 1, and what a tool's
    native code wrote to its standard output went into the connection (runs halted, connection reset).
    /dev/null fills a closed standard descriptor when a command starts."""
    code = (
        "import os, sys\n"
        "from bide._stdout import closed_stdout_fails\n"
        "closed_stdout_fails()\n"
        "fd = os.open(sys.executable, os.O_RDONLY)\n"
        "os.write(2, str(fd).encode())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=False, stderr=subprocess.PIPE, env=env, timeout=60,
        preexec_fn=lambda: (os.close(0), os.close(1)),  # (the test's own child: no threads to race)
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert int(done.stderr) > 2


def test_a_lost_output_of_an_earlier_command_in_the_process_is_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`main()` called twice in one process: a first command's standard output closed made the second
    exit 2, "standard output is closed", though its own output was written."""
    import io

    from bide import _stdout

    monkeypatch.setattr(sys, "stdout", None)
    _stdout.closed_stdout_fails()
    print("lost")
    assert _stdout.lost_output()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    _stdout.closed_stdout_fails()
    print("written")
    assert not _stdout.lost_output() and _stdout.ended(0) == 0


def test_a_der_key_or_a_file_it_cannot_read_is_not_written_over(tmp_path: Path) -> None:
    """`-o` over a DER private key (PKCS#8, plain or encrypted) wrote the output over it; so it did over a key
    file the user running the command cannot read (another user's 0600 key in a directory both may write
    to): unable to look inside, the check took it for no key. Both are refused, and the file is kept."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from bide._errors import ConfigError
    from bide._files import check_output

    key = Ed25519PrivateKey.generate()
    der = serialization.Encoding.DER
    pkcs8 = serialization.PrivateFormat.PKCS8
    for name, encryption in (("plain.der", serialization.NoEncryption()),
                             ("locked.der", serialization.BestAvailableEncryption(b"secret"))):  # fmt: skip
        path = tmp_path / name
        path.write_bytes(key.private_bytes(der, pkcs8, encryption))
        with pytest.raises(ConfigError, match="holds a private key"):
            check_output(str(path))
    # Outside pytest's 0700 folders, which another user cannot enter.
    shared = Path(tempfile.mkdtemp(prefix="bide-shared-", dir="/tmp"))
    try:
        shared.chmod(0o777)
        theirs = shared / "theirs.key"
        theirs.write_text(_KEY)
        theirs.chmod(0o600 if os.geteuid() == 0 else 0o000)
        pid = os.fork()  # a child that drops root (root reads every file); bide is imported already
        if pid == 0:
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setuid(65534)
                check_output(str(theirs))
            except ConfigError as exc:
                code = 2 if "cannot be read to check that it holds no private key" in str(exc) else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 2
        theirs.chmod(0o600)
        assert theirs.read_text() == _KEY
    finally:
        shutil.rmtree(shared)


def test_a_replaced_file_whose_group_cannot_be_kept_loses_its_group_bits() -> None:
    # A user replaces its own 0640 file whose group it does not belong to: the new file cannot have that
    # group, and gets the user's own instead; the group read bit, meant for the other group, was kept and so
    # let a group the owner never chose read the evidence. A group it can keep keeps its bits.
    shared = Path(tempfile.mkdtemp(prefix="bide-group-", dir="/tmp"))
    try:
        shared.chmod(0o777)
        theirs, kept = shared / "theirs.json", shared / "kept.json"
        pid = os.fork()  # a child that is no root (root may give a file any group)
        if pid == 0:
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setgroups([])
                    os.setuid(65534)
                mine = os.getegid()
                foreign = next(g for g in range(70_000) if g != mine and g not in os.getgroups())
                for path, group in ((theirs, foreign), (kept, mine)):
                    path.write_text("old")
                    path.chmod(0o640)
                    write_whole(path, b"new", mode=0o640, owner=(os.geteuid(), group))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert theirs.read_bytes() == kept.read_bytes() == b"new"
        assert stat.S_IMODE(theirs.stat().st_mode) == 0o600
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640
        assert theirs.stat().st_gid == kept.stat().st_gid  # the child's own group, the one it could give
    finally:
        shutil.rmtree(shared)
