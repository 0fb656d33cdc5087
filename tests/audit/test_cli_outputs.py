"""What `bide-audit` (export, keygen) and `bide keygen` write, and what they refuse to write: an output that
is one of the inputs, a missing directory, a half key pair, a replaced .pub, and limits that lift themselves.
End to end through subprocesses; every refusal is a usage error that leaves every file as it was."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mounts import tmpfs

import bide

from .conftest import write_run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"bide": "bide._cli", "bide-audit": "bide.audit._cli"}


def _run(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", MODULES[prog], *args], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=120,
    )


def _run_all(prog: str, *calls: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: _run(prog, *args, cwd=cwd), calls))


def _snapshot(directory: Path) -> dict[str, bytes | str | None]:
    """Every path under `directory` with its bytes (None for a directory, where it leads for a link)."""
    return {
        str(p.relative_to(directory)): (
            os.readlink(p) if p.is_symlink() else None if p.is_dir() else p.read_bytes()
        )
        for p in directory.rglob("*")
    }


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """A directory with a SQLite store `store.db` holding run `r` and a signing key `log.key`."""
    store = bide.open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        write_run(store, "r", 2)
    finally:
        store.close()
    assert _run("bide-audit", "keygen", "log.key", cwd=tmp_path).returncode == 0
    return tmp_path


def test_export_refuses_an_output_that_is_one_of_its_inputs_and_writes_nothing(exported: Path) -> None:
    (exported / "link.db").symlink_to("store.db")
    os.link(exported / "log.key", exported / "hard.key")
    before = _snapshot(exported)
    base = ("export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key", "--anchor-dir", "a")
    outputs = ["store.db", "./store.db", str(exported / "store.db"), "link.db", "log.key", "hard.key",
               "log.key.pub", "store.db-wal"]
    results = _run_all(
        "bide-audit",
        *((*base, "-o", out) for out in outputs),
        (*base[:6], "hard.key", "-o", "log.key"),  # the key named through another link
        (*base, "--head", "-o", "store.db"),
        cwd=exported,
    )
    for result in results:
        assert result.returncode == 2, result.stderr
        assert "is the input file" in result.stderr and "would destroy it" in result.stderr
    assert _snapshot(exported) == before  # store, key and .pub intact; no head published into a/
    store = bide.open_store("sqlite:///" + str(exported / "store.db"))
    try:
        assert store.load("r")
    finally:
        store.close()


def test_export_refuses_the_files_sqlite_and_the_key_name_after_where_links_lead(exported: Path) -> None:
    """The store named through a link (`link.db -> store.db`): SQLite keeps its committed records in
    `store.db-wal`, named after the file itself, and `-o store.db-wal` replaced that log, exit 0, losing
    every record the WAL held. The key named through a link: `-o log.key.pub` replaced the public key
    verifiers pin. Both are inputs under other names, refused before anything is written."""
    (exported / "link.db").symlink_to("store.db")
    (exported / "lk").symlink_to("log.key")
    wal = exported / "store.db-wal"
    wal.write_bytes(b"")  # (a driver holding the store keeps it there)
    before = _snapshot(exported)
    through_store = ("export", "--store", "sqlite:///link.db", "--run", "r", "--key", "log.key", "--head")
    through_key = ("export", "--store", "sqlite:///store.db", "--run", "r", "--key", "lk", "--head")
    results = _run_all(
        "bide-audit",
        (*through_store, "-o", "store.db-wal"),
        (*through_store, "-o", "store.db-shm"),
        (*through_key, "-o", "log.key.pub"),
        cwd=exported,
    )
    for result in results:
        assert result.returncode == 2, result.stderr
        assert "is the input file" in result.stderr and "would destroy it" in result.stderr
    assert _snapshot(exported) == before


def test_export_refuses_a_loop_of_links_and_a_link_it_would_not_follow_before_publishing(
    exported: Path,
) -> None:
    """A loop of links as -o, --key or the store was an internal error (exit 3). A link to a missing
    directory, or one owned by another user, was refused only once the head had been signed and published
    to --anchor-dir. All are refused first now: exit 2, nothing published or written."""
    (exported / "loop-a").symlink_to("loop-b")
    (exported / "loop-b").symlink_to("loop-a")
    (exported / "dangling").symlink_to("/nonexistent/dir/ev.json")
    (exported / "foreign").symlink_to("ev.json")
    os.lchown(exported / "foreign", 65534, 65534)
    (exported / "anchor").mkdir()
    before = _snapshot(exported)
    base = ("export", "--run", "r", "--head", "--anchor-dir", "anchor")
    store, key = ("--store", "sqlite:///store.db"), ("--key", "log.key")
    loop_out, loop_key, loop_store, dangling, foreign = _run_all(
        "bide-audit",
        (*base, *store, *key, "-o", "loop-a"),
        (*base, *store, "--key", "loop-a", "-o", "ev.json"),
        (*base, "--store", "sqlite:///loop-a", *key, "-o", "ev.json"),
        (*base, *store, *key, "-o", "dangling"),
        (*base, *store, *key, "-o", "foreign"),
        cwd=exported,
    )
    assert loop_out.returncode == 2 and "a loop of symbolic links" in loop_out.stderr, loop_out.stderr
    assert loop_key.returncode == 4 and "Too many levels of symbolic links" in loop_key.stderr, loop_key
    assert loop_store.returncode == 4, loop_store.stderr
    assert dangling.returncode == 2 and "the directory /nonexistent/dir does not exist" in dangling.stderr
    assert foreign.returncode == 2 and "owned by another user" in foreign.stderr, foreign.stderr
    for result in (loop_out, loop_key, loop_store, dangling, foreign):
        assert "INTERNAL" not in result.stderr and "published" not in result.stderr, result.stderr
    assert _snapshot(exported) == before  # no head in anchor/, no ev.json


def test_export_into_a_missing_directory_or_onto_a_directory_is_a_usage_error_and_publishes_nothing(
    exported: Path,
) -> None:
    before = _snapshot(exported)
    base = ("export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key")
    missing, here, slash, record = _run_all(
        "bide-audit",
        (*base, "-o", "nodir/ev.json", "--anchor-dir", "anchor"),
        (*base, "-o", ".", "--anchor-dir", "anchor"),
        (*base, "-o", "new/", "--head"),
        (*base, "-o", "nodir/b.json", "--record", "run:start", "--anchor-dir", "anchor"),
        cwd=exported,
    )
    for result in (missing, record):
        assert result.returncode == 2, result.stderr
        assert "the directory nodir does not exist" in result.stderr
    for result in (here, slash):
        assert result.returncode == 2, result.stderr
        assert "is a directory" in result.stderr
    assert "INTERNAL" not in missing.stderr + here.stderr + slash.stderr + record.stderr
    assert _snapshot(exported) == before  # no anchor/ (no head published), no new file


def test_export_onto_a_pipe_or_a_device_or_a_name_too_long_is_a_usage_error(exported: Path) -> None:
    """The rename that writes the package would replace a FIFO or a device node (as root, -o /dev/null
    replaced /dev/null with a file): refused, exit 2, the pipe left as it was. A name longer than the
    filesystem takes is a usage error too, not an internal one."""
    os.mkfifo(exported / "pipe")
    (exported / "to-pipe").symlink_to("pipe")
    base = ("export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key")
    results = _run_all(
        "bide-audit",
        (*base, "-o", "pipe"),
        (*base, "-o", "to-pipe", "--head"),
        (*base, "-o", "x" * 300 + ".json"),
        (*base, "-o", "x" * 300 + ".json", "--json"),
        cwd=exported,
    )
    for result in results[:2]:
        assert result.returncode == 2, result.stderr
        assert "is not a regular file" in result.stderr
    for result in results[2:]:
        assert result.returncode == 2, result.stderr
        assert "cannot be a file here" in result.stderr + result.stdout and "INTERNAL" not in result.stderr
    assert (exported / "pipe").is_fifo() and (exported / "to-pipe").is_symlink()
    assert not [p.name for p in exported.iterdir() if p.name.endswith((".json", ".tmp"))]


def test_export_refuses_a_missing_anchor_dir_and_says_where_a_head_was_published(exported: Path) -> None:
    """Like -o, --anchor-dir is never created (a typo must not scatter heads where no one looks): a missing
    or non-directory anchor is a usage error before anything is read or written; a published head is named."""
    (exported / "afile").write_text("x")
    before = _snapshot(exported)
    base = ("export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key")
    nested, flat, file, head = _run_all(
        "bide-audit",
        (*base, "-o", "ev.json", "--anchor-dir", "anchors/nested"),
        (*base, "-o", "ev.json", "--anchor-dir", "anchors", "--json"),
        (*base, "-o", "h.json", "--head", "--anchor-dir", "afile"),
        (*base, "-o", "h.json", "--head", "--anchor-dir", "missing"),
        cwd=exported,
    )
    for result, name in ((nested, "anchors/nested"), (file, "afile"), (head, "missing")):
        assert result.returncode == 2, result.stderr
        assert f"--anchor-dir {name} " in result.stderr and "nothing was published" in result.stderr
    assert "does not exist (create it first)" in nested.stderr and "is not a directory" in file.stderr
    as_json = json.loads(flat.stdout)
    assert as_json["exit_code"] == 2 and "does not exist" in as_json["message"]
    assert _snapshot(exported) == before  # no anchors/ created, no ev.json or h.json
    (exported / "anchors").mkdir()
    done = _run("bide-audit", *base, "-o", "ev.json", "--anchor-dir", "anchors", cwd=exported)
    assert done.returncode == 0, done.stderr
    [published] = list((exported / "anchors").rglob("*.json"))
    where = published.relative_to(exported)
    assert f"Published its signed head (4 records) to {where}." in done.stdout, done.stdout
    done = _run("bide-audit", *base, "-o", "p.json", "--consistency-from", "1", "--anchor-dir", "anchors",
                cwd=exported)
    assert done.returncode == 0 and "nothing was published to anchors" in done.stdout, done


@pytest.mark.parametrize("prog", sorted(MODULES))
def test_keygen_into_a_missing_directory_or_onto_a_directory_is_a_usage_error(
    prog: str, tmp_path: Path
) -> None:
    (tmp_path / "d.pub").mkdir()
    missing, here, slash, pub_dir, forced = _run_all(
        prog,
        ("keygen", "nodir/key"),
        ("keygen", "."),
        ("keygen", "new/"),
        ("keygen", "d"),
        ("keygen", "d", "--force"),
        cwd=tmp_path,
    )
    assert missing.returncode == 2, missing.stderr
    assert "the directory nodir" in missing.stderr and "does not exist" in missing.stderr
    for result in (here, slash, pub_dir, forced):
        assert result.returncode == 2 and "is a directory" in result.stderr, result.stderr
    assert "--force" not in missing.stderr  # forcing would not help
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.pub"]  # no private key without its .pub


def test_keygen_keeps_no_private_key_when_its_pub_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bide._errors import ConfigError
    from bide.audit import _keys

    real = _keys.write_whole

    def full_disk(path: Path, data: bytes, **kw: object) -> None:
        if path.name.endswith(".pub"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_keys, "write_whole", full_disk)
    with pytest.raises(ConfigError, match="No space left on device"):
        _keys.generate_key(tmp_path / "k")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(_keys, "write_whole", real)
    _keys.generate_key(tmp_path / "k")  # and a rerun is not refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]


def test_an_export_whose_output_does_not_fit_says_the_head_it_published(
    exported: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The head an export holds is published once its output is staged beside its name; when the output's
    rename then fails, the message said "nothing was written" while the head sat in the anchor directory.
    (A full disk is found earlier, while staging: then nothing is published.)"""
    import os

    from bide.audit import _cli

    (exported / "anchors").mkdir()
    real = os.replace

    def failing_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name == "ev.json":
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing_rename)
    monkeypatch.chdir(exported)
    argv = ["export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key", "-o", "ev.json"]
    assert _cli.main([*argv, "--anchor-dir", "anchors"]) == 2
    err = capsys.readouterr().err
    [head] = list((exported / "anchors").rglob("*.json"))
    assert "ev.json was not written" in err
    assert f"was published to anchors/{head.parent.name}/{head.name}" in err
    assert not (exported / "ev.json").exists()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 64 KiB tmpfs mounted for the test (the tests run as root), unmounted afterwards."""
    with tmpfs(tmp_path / "small-disk", "65536") as path:
        yield path


def _fill(disk: Path) -> None:
    """Leave no room on `disk` for a new file's data."""
    free = os.statvfs(disk)
    (disk / ".filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize))


def test_an_anchor_dir_on_a_full_disk_is_a_usage_error_that_leaves_it_as_it_was(
    exported: Path, small_disk: Path
) -> None:
    """A head that does not fit in --anchor-dir was exit 4 ("unreadable input"), where `-o` on the same disk
    is 2, and left behind the empty per-log folder created for it; a head anchored before stays as it was."""
    anchors = small_disk / "anchors"
    anchors.mkdir()
    base = ("export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key", "-o", "ev.json",
            "--anchor-dir", str(anchors))  # fmt: skip
    _fill(small_disk)
    full = _run("bide-audit", *base, cwd=exported)
    assert full.returncode == 2, full.stderr
    assert f"ERROR: cannot write the signed head to --anchor-dir {anchors} (" in full.stderr
    assert "No space left on device; nothing was published, and ev.json was not written" in full.stderr
    assert list(anchors.iterdir()) == [] and not (exported / "ev.json").exists()

    (small_disk / ".filler").unlink()
    assert _run("bide-audit", *base, cwd=exported).returncode == 0
    (exported / "ev.json").unlink()
    before = _snapshot(anchors)
    [(folder, is_folder), (head, _)] = sorted(before.items())
    assert is_folder is None and head.startswith(f"{folder}/")  # the per-log folder and the head in it
    _fill(small_disk)
    full = _run("bide-audit", *base, cwd=exported)
    assert full.returncode == 2 and "No space left on device" in full.stderr, full.stderr
    assert _snapshot(anchors) == before and not (exported / "ev.json").exists()  # no temporary file either


@pytest.mark.parametrize("prog", sorted(MODULES))
def test_keygen_refuses_to_replace_an_existing_pub_without_force(prog: str, tmp_path: Path) -> None:
    (tmp_path / "a.pub").write_text("alice's pinned public key\n")
    refused = _run(prog, "keygen", "a", cwd=tmp_path)
    assert refused.returncode == 2
    assert "a.pub already exists" in refused.stderr and "--force" in refused.stderr
    assert (tmp_path / "a.pub").read_text() == "alice's pinned public key\n"
    assert not (tmp_path / "a").exists()
    forced = _run(prog, "keygen", "a", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "a.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


def test_a_public_key_given_as_the_signing_key_is_named_as_one(exported: Path) -> None:
    os.chmod(exported / "log.key.pub", 0o644)
    out = _run(
        "bide-audit", "export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key.pub",
        "-o", "ev.json", cwd=exported,
    )
    assert out.returncode == 4
    assert "is a public key, not a PEM private key" in out.stderr
    assert "chmod" not in out.stderr and "accessible to other users" not in out.stderr
    assert not (exported / "ev.json").exists()


def test_negative_or_zero_limits_are_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "bundle.json").write_text("{}")
    key = "00" * 32
    results = _run_all(
        "bide-audit",
        ("verify", "bundle.json", "--pubkey", key, "--max-input-bytes", "-2"),
        ("verify", "bundle.json", "--pubkey", key, "--max-input-bytes", "0"),
        ("verify-evidence", "bundle.json", "--pubkey", key, "--max-input-bytes", "-1"),
        ("verify", "bundle.json", "--pubkey", key, "--max-clock-skew", "-1"),
        ("verify", "bundle.json", "--pubkey", key, "--max-input-bytes", "lots"),
        cwd=tmp_path,
    )
    for result in results:
        assert result.returncode == 2, result.stderr
        assert "usage error: argument --max-" in result.stderr


def test_export_refuses_to_write_over_a_private_key_that_is_not_its_input(exported: Path) -> None:
    """`-o` naming another private key file (an approver's, the log key of another store) replaced the key
    with evidence, exit 0: a key nothing can make again. Refused (exit 2), as over an input."""
    assert _run("bide", "keygen", "alice.key", cwd=exported).returncode == 0
    before = _snapshot(exported)
    base = ("export", "--store", "sqlite:///store.db", "--run", "r", "--key", "log.key", "--head")
    done = _run("bide-audit", *base, "-o", "alice.key", cwd=exported)
    assert done.returncode == 2, done.stderr
    assert "alice.key holds a private key; refusing to write over it" in done.stderr
    assert _snapshot(exported) == before
    assert _run("bide-audit", *base, "-o", "alice.key.pub", cwd=exported).returncode == 0  # a public key
