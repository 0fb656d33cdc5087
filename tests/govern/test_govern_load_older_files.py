"""`Machine.load` of a file an older govern saved, untouched: it loads when every claim it makes checks, and
a claim edited in it (content hash recomputed) is still refused.

Two forms older versions wrote differ from today's without being wrong:

- before the delivery theorems (commit 1073cd4) the report's guarantee and theorems were worded without
  them, and the oracle record had no "delivery" entry. data/orders-f8308f0.govern is examples/orders.py
  saved by the first release, f8308f0; data/lamp-8f74d63.govern is `lamp()` below (CC2 on the reachable
  domain, which later versions cited otherwise than f8308f0) saved by 8f74d63. Both were refused as
  "altered (or damaged) after it was saved";
- before commit 6960c75 a machine of more than 2**22 table entries recorded its rules check as deferred.

Loading reads those claims in today's words; the report handed out is the one a build gives today.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_govern_build import orders
from test_govern_load_claims import Arrays, Doc, edit_json, resave

from govern import Machine, MachineFileError, Registry

DATA = Path(__file__).parent / "data"
FIRST_RELEASE = DATA / "orders-f8308f0.govern"
BEFORE_DELIVERY = DATA / "lamp-8f74d63.govern"
OLDER = "is in the form an older govern saved"
CONFLUENCE = "confluence of the full rewrite system (WFC + CC1 + CC2, Newman's lemma)"
ALTERED = "so it was altered"


def lamp() -> Registry:
    r = Registry("lamp")
    on = r.bool("on")
    seen = r.bool("seen")
    r.event("switch_on", effect={on: True})
    r.event("switch_off", effect={on: False})
    r.event("note", effect={seen: ~seen})
    r.independent("switch_on", "note")
    return r


def same_report(loaded: Machine, built: Machine) -> None:
    assert loaded.digest == built.digest
    said, found = built.report.to_dict(), loaded.report.to_dict()
    said.pop("timings"), found.pop("timings")
    assert found == said


def stored_report(path: Path) -> Doc:
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as z:
        arrays: Arrays = {k: np.array(z[k]) for k in z.files}
    doc: Doc = json.loads(bytes(arrays["report"]).decode())
    return doc


def test_the_fixtures_are_in_the_older_form() -> None:
    for path in (FIRST_RELEASE, BEFORE_DELIVERY):
        doc = stored_report(path)
        assert "delivery" not in doc["oracle"] and "method" not in doc
        assert not any("Govern.Delivery" in t for t in doc["theorems"])


def test_an_untouched_file_of_the_first_release_loads_with_todays_report() -> None:
    built = orders().build()
    loaded = Machine.load(FIRST_RELEASE, digest=built.digest)
    same_report(loaded, built)
    oracle = loaded.report.oracle
    assert oracle is not None and oracle["delivery"]["obligations"] == [[0, 1], [1, 2]]
    assert any(t.startswith("Govern.Delivery.check_tables_replica") for t in loaded.report.theorems)
    assert loaded.replay(["restock", "pay", "ship"]) == built.replay(["restock", "pay", "ship"])


def test_cc2_on_the_reachable_domain_loads_in_either_older_wording(tmp_path: Path) -> None:
    built = lamp().build("reachable")
    assert built.report.cc2 and built.report.obligations and built.report.not_idempotent
    same_report(Machine.load(BEFORE_DELIVERY), built)
    # f8308f0 cited confluence on every domain (8f74d63's file differs from its own in that line only).
    first = resave(BEFORE_DELIVERY, tmp_path / "lamp-f8308f0.govern", edit_json("report", _f8308f0_wording))
    same_report(Machine.load(first), built)


def _f8308f0_wording(d: Doc) -> None:
    assert d["theorems"][1].startswith("interleaved compensation from D")
    d["theorems"][1] = CONFLUENCE


def _drop_obligations(d: Doc) -> None:
    d["obligations"] = []
    d["guarantee"] = d["guarantee"].replace(
        " 2 undeclared pair(s) do not commute and must be delivered in one fixed causal order (see "
        "obligations).",
        " Every undeclared pair commutes as well.",
    )


def _oracle_theorem(d: Doc) -> None:
    d["oracle"]["theorem"] = "Govern.Bridge.check_tables_convergence"
    d["theorems"][-1] = "oracle: Govern.Bridge.check_tables_convergence"


#: Claims edited in the first release's file, in its own wording (so it still reads as an older file).
CONTRADICTED: dict[str, tuple[Callable[[Doc], None], str]] = {
    "no not-idempotent event": (lambda d: d.__setitem__("not_idempotent", []), "not-idempotent events"),
    "no obligation": (_drop_obligations, "causal-order obligations"),
    "obligation witness": (lambda d: d["obligations"][0]["start"].__setitem__("stock", 2), "witness step"),
    "oracle theorem": (_oracle_theorem, "oracle verdict"),
    "max repair depth": (lambda d: d.__setitem__("max_repair_depth", 3), "max repair depth"),
}


@pytest.mark.parametrize("edit", sorted(CONTRADICTED))
def test_a_claim_edited_in_an_older_file_is_refused(edit: str, tmp_path: Path) -> None:
    change, what = CONTRADICTED[edit]
    path = resave(FIRST_RELEASE, tmp_path / "edited.govern", edit_json("report", change))
    with pytest.raises(MachineFileError, match=what) as caught:
        Machine.load(path)
    message = str(caught.value)
    assert OLDER in message and "delivery theorems" in message and "contradict" in message


#: Edits that leave the file in no form any govern wrote: compared as they stand.
NO_FORM: dict[str, tuple[Path, Callable[[Doc], None], str]] = {
    "older guarantee rewritten": (
        FIRST_RELEASE, lambda d: d.__setitem__("guarantee", "Every order converges."), "guarantee"
    ),
    "confluence without CC2": (FIRST_RELEASE, lambda d: d["theorems"].insert(1, CONFLUENCE), "theorems"),
}


@pytest.mark.parametrize("edit", sorted(NO_FORM))
def test_an_older_file_edited_out_of_its_form_is_refused_as_altered(edit: str, tmp_path: Path) -> None:
    path, change, what = NO_FORM[edit]
    edited = resave(path, tmp_path / "edited.govern", edit_json("report", change))
    with pytest.raises(MachineFileError, match=what) as caught:
        Machine.load(edited)
    assert ALTERED in str(caught.value)


@pytest.fixture(scope="module")
def current(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("current") / "lamp.govern"
    lamp().build("reachable").save(path)
    return path


def _as_older(older: Doc) -> Callable[[Doc], None]:
    def change(d: Doc) -> None:
        for key in ("guarantee", "theorems"):
            d[key] = older[key]
        d["oracle"].pop("delivery")

    return change


def test_a_current_file_in_half_the_older_form_is_refused(current: Path, tmp_path: Path) -> None:
    older = stored_report(BEFORE_DELIVERY)
    halves: list[tuple[Callable[[Doc], None], str]] = [
        (lambda d: d["oracle"].pop("delivery"), "oracle verdict"),
        (lambda d: d.__setitem__("guarantee", older["guarantee"]), "guarantee"),
        (lambda d: d.__setitem__("theorems", older["theorems"]), "theorems"),
    ]
    for change, what in halves:
        path = resave(current, tmp_path / "half.govern", edit_json("report", change))
        with pytest.raises(MachineFileError, match=what) as caught:
            Machine.load(path)
        assert ALTERED in str(caught.value)


def test_a_current_file_reworded_whole_in_the_older_form_hands_out_the_same_report(
    current: Path, tmp_path: Path
) -> None:
    # The older form words the same claims (nothing else differs), so loading it hands out nothing new.
    path = resave(current, tmp_path / "reworded.govern", edit_json("report", _as_older(stored_report(
        BEFORE_DELIVERY))))
    assert stored_report(path)["guarantee"] != stored_report(current)["guarantee"]
    same_report(Machine.load(path), Machine.load(current))


def _deferred(entries: int) -> Callable[[Doc], None]:
    def change(d: Doc) -> None:
        d["oracle"]["rules_checked"] = (
            f"deferred: {entries:,} table entries is above the build-time limit of 4,194,304; govern "
            "certify and govern check run it"
        )

    return change


def test_a_rules_check_deferred_by_an_older_build_is_run_and_reported(tmp_path: Path) -> None:
    r = Registry("wide")
    x = r.int("x", 0, 1024)
    y = r.int("y", 0, 1023)
    r.event("up_x", guard=x < 1024, effect={x: x + 1})
    r.event("up_y", guard=y < 1023, effect={y: y + 1})
    r.event("reset", effect={x: 0, y: 0})
    r.independent("up_x", "up_y")
    built = r.build()
    entries = built.n_states * (len(built.events) + 1)
    assert entries > 1 << 22
    built.save(tmp_path / "wide.govern")
    path = resave(tmp_path / "wide.govern", tmp_path / "old.govern", edit_json("report", _deferred(entries)))
    same_report(Machine.load(path), built)
    wrong = resave(path, tmp_path / "wrong.govern", edit_json("report", _deferred(entries + 1)))
    with pytest.raises(MachineFileError, match="oracle verdict"):
        Machine.load(wrong)


def test_a_deferred_rules_check_below_the_old_limit_is_refused(current: Path, tmp_path: Path) -> None:
    entries = 4 * 4  # no build deferred it: 4 states x (3 events + 1)
    path = resave(current, tmp_path / "deferred.govern", edit_json("report", _deferred(entries)))
    with pytest.raises(MachineFileError, match="oracle verdict") as caught:
        Machine.load(path)
    assert ALTERED in str(caught.value)


def _older_valid(theorem: str) -> Callable[[Doc], None]:
    """A report of lamp() on the valid domain in the form before the delivery theorems, citing `theorem`
    for CC2."""
    older = stored_report(BEFORE_DELIVERY)

    def change(d: Doc) -> None:
        d["guarantee"] = older["guarantee"].replace(
            "From the initial state (and every state reachable from it)", "From every valid state"
        )
        d["theorems"] = [older["theorems"][0], theorem, d["theorems"][-1]]  # "oracle: ..." as it was
        d["oracle"].pop("delivery")

    return change


def test_cc2_on_the_valid_domain_loads_only_in_the_wording_older_builds_gave_it(tmp_path: Path) -> None:
    built = lamp().build("valid")
    saved = tmp_path / "lamp.govern"
    built.save(saved)
    path = resave(saved, tmp_path / "older.govern", edit_json("report", _older_valid(CONFLUENCE)))
    same_report(Machine.load(path), built)
    interleaved = stored_report(BEFORE_DELIVERY)["theorems"][1]  # what 8f74d63 cited on the reachable domain
    path = resave(saved, tmp_path / "no-form.govern", edit_json("report", _older_valid(interleaved)))
    with pytest.raises(MachineFileError, match="theorems") as caught:
        Machine.load(path)
    assert ALTERED in str(caught.value)
