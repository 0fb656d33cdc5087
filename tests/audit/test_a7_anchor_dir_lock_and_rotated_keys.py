"""`bide-audit export --anchor-dir` compares its head with the run's heads anchored there and publishes it
under a lock. The lock was a `flock` on the directory itself, which cannot be taken in a directory the
exporting user may write and search but not list (nor on NFS): two exports at once there were not kept
apart. It is now also a lock file in the directory, made for the while and removed after. And heads
anchored under an earlier key of the log (before a rotation) were never compared: the tree is the same
log whatever key signs its heads, so `--anchor-key FILE.pub` has them compared too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from bide.audit._anchor import DirectoryPublisher
from bide.audit._cli import _RecordingPublisher

from .test_audit_edges_forks_and_sizes import DROP_TREE, EDIT, _anchored, _sql, _store, audit

REPO = Path(__file__).resolve().parents[2]
# Root passes over directory modes: the export runs without the capabilities that let it, as another user.
WITHOUT_ROOTS_REACH = ["capsh", "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c",
                       'exec "$@"', "--"]  # fmt: skip
# The export, waiting 1 s (not 30) for an anchor directory another export holds.
_EXPORT_WAITING_1_S = (
    "import sys\nimport bide.audit._cli as cli\ncli._ANCHOR_LOCK_WAIT_S = 1.0\n"
    "sys.exit(cli.main(sys.argv[1:]))"
)


def _export_waiting_1_s(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    wrap = WITHOUT_ROOTS_REACH if os.geteuid() == 0 else []
    assert not wrap or shutil.which("capsh"), "make test installs capsh (libcap2-bin)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [*wrap, sys.executable, "-c", _EXPORT_WAITING_1_S, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_an_export_waits_for_another_in_an_anchor_dir_it_may_not_list(tmp_path: Path) -> None:
    url = _store(tmp_path, "r1")
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    base = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--anchor-dir", "anchor"]
    assert audit(*base, "--head", "-o", "first.json", cwd=tmp_path).returncode == 0
    [first] = _anchored(tmp_path)
    tmp_path.chmod(0o777)
    anchor.chmod(0o333)  # write and search, no listing: the run's folder inside stays readable
    try:
        # Another export holds the directory while it compares and publishes.
        with _RecordingPublisher(anchor, tmp_path / "other.json").exclusive():
            waited = _export_waiting_1_s(*base, "--head", "-o", "second.json", cwd=tmp_path)
        assert waited.returncode == 2, waited.stdout + waited.stderr
        assert "stayed locked by another export" in waited.stderr, waited.stderr
        assert _anchored(tmp_path) == [first] and not (tmp_path / "second.json").exists()
        after = _export_waiting_1_s(*base, "--head", "-o", "third.json", cwd=tmp_path)
    finally:
        anchor.chmod(0o755)
    # Once the other export let go, the export takes its turn; the lock file goes with it.
    assert after.returncode == 0, after.stdout + after.stderr
    assert "could not be locked" not in after.stdout, after.stdout
    assert len(_anchored(tmp_path)) == 2 and (tmp_path / "third.json").exists()
    assert sorted(p.name for p in anchor.iterdir()) == [first.parent.name]


def test_heads_anchored_under_an_earlier_key_are_compared_when_it_is_given(tmp_path: Path) -> None:
    url = _store(tmp_path, "r1")
    (tmp_path / "anchor").mkdir()
    old = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--anchor-dir", "anchor"]
    assert audit(*old, "--head", "-o", "before.json", cwd=tmp_path).returncode == 0
    [anchored] = _anchored(tmp_path)
    assert audit("keygen", "new.key", cwd=tmp_path).returncode == 0  # the log's key is rotated
    new = ["export", "--store", url, "--run", "r1", "--key", "new.key", "--anchor-dir", "anchor"]
    # The same journal under the new key is no fork of the head anchored under the earlier one (compared in
    # a copy of the directory, so that the head it publishes is not among those compared below).
    shutil.copytree(tmp_path / "anchor", tmp_path / "copy")
    same = audit(*new[:-1], "copy", "--anchor-key", "log.key.pub", "--head", "-o", "same.json", cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "other key" not in same.stdout and "Published its signed head" in same.stdout, same.stdout
    _sql(tmp_path, EDIT, *DROP_TREE)  # a record edited behind bide, the tree rebuilt
    forked = audit(*new, "--anchor-key", "log.key.pub", "--head", "-o", "forked.json", cwd=tmp_path)
    assert forked.returncode == 1, forked.stdout + forked.stderr
    earlier = DirectoryPublisher(tmp_path / "anchor").anchored("r1")[0][1].key_id
    assert f"{anchored.relative_to(tmp_path)} (5 records, signed by {earlier}): it is of the same size, 5 " \
           "records, with another root" in forked.stderr, forked.stderr  # fmt: skip
    assert "signed by its key or one given with --anchor-key" in forked.stderr
    assert not (tmp_path / "forked.json").exists() and _anchored(tmp_path) == [anchored]
    # Without it, the heads of the earlier key are not compared, and the message says so.
    unchecked = audit(*new, "--head", "-o", "unchecked.json", cwd=tmp_path)
    assert unchecked.returncode == 0, unchecked.stdout + unchecked.stderr
    assert f"signed by 1 other key(s) ({earlier}) were not compared" in unchecked.stdout, unchecked.stdout
    assert "give its earlier public keys with --anchor-key" in unchecked.stdout


def test_anchor_key_needs_anchor_dir(tmp_path: Path) -> None:
    url = _store(tmp_path, "r1")
    done = audit("export", "--store", url, "--run", "r1", "--key", "log.key", "--head", "-o", "h.json",
                 "--anchor-key", "log.key.pub", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "--anchor-key needs --anchor-dir" in done.stderr, done.stderr
    assert not (tmp_path / "h.json").exists()
