"""`EventLog.bind` by any certificate `govern.certify` makes, as an operator holding only the certificate file
has it (`govern.read_certificate`): a table, a composed and a symbolic certificate bind a log to the same
machine as the machine itself, so a log bound one way accepts the other. The certificate of a symbolically
verified machine was refused ("must be a govern.Machine, a govern.Certificate or a digest"), and
`govern.read_certificate` could not read its file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import govern
from govern import Machine, Registry, max_, min_
from govern.runtime._eventlog import Event, EventLog, InvalidInput, MachineMismatch

from .machines import order_machine


def _limits() -> Machine:
    """The "Large integer domains" machine of docs/govern.md: verified symbolically (no tables)."""
    r = Registry("limits")
    limit = r.int("limit", 0, 10**9 - 1)
    r.invariant("at_least_ten", holds=limit >= 10, repair={limit: 10})
    r.event("floor_1k", effect={limit: max_(limit, 1000)})
    r.event("cap_900m", effect={limit: min_(limit, 900_000_000)})
    return r.build()


def _pair() -> Machine:
    """Two independent counters, built by components."""
    r = Registry("pair")
    a, b = r.int("a", 0, 3), r.int("b", 0, 3)
    r.event("raise_a", effect={a: max_(a, 2)})
    r.event("raise_b", effect={b: max_(b, 2)})
    return r.build(compose=True)


MACHINES: dict[str, Callable[[], Machine]] = {"tables": order_machine, "composed": _pair, "symbolic": _limits}


@pytest.mark.parametrize("kind", MACHINES)
def test_a_log_bound_by_the_machine_or_any_of_its_certificates_is_one_binding(
    kind: str, tmp_path: Path
) -> None:
    machine = MACHINES[kind]()
    certificate = govern.certify(machine)
    read = govern.read_certificate(certificate.to_bytes())
    assert type(read) is type(certificate) and read.to_bytes() == certificate.to_bytes()
    url = f"sqlite:///{tmp_path}/events.db"
    event = machine.events[0]
    for log_name, first, then in (
        ("machine-first", machine, read),
        ("certificate-first", read, machine),
        ("certified", certificate, read),
    ):
        bound = EventLog(url, name=log_name)
        bound.bind(first)
        assert bound.machine() == machine.digest
        again = EventLog(url, name=log_name)
        again.bind(then)  # the same machine: accepted, nothing changes
        appended = again.append(
            Event(id=f"{log_name}-1", machine=machine.digest, record="r", event=event, producer="p")
        )
        assert appended.created and appended.event.position == 0
        with pytest.raises(InvalidInput, match="event"):
            again.append(
                Event(id=f"{log_name}-2", machine=machine.digest, record="r", event="nope", producer="p")
            )
        bound.close()
        again.close()


def test_a_symbolic_certificate_binds_its_own_machine_only() -> None:
    limits = govern.certify(_limits())
    log = EventLog("memory://")
    log.bind(order_machine())
    with pytest.raises(MachineMismatch):
        log.bind(limits)
    with pytest.raises(InvalidInput, match="events"):
        EventLog("memory://").bind(limits, events=["floor_1k", "cap_900m"])


def test_read_certificate_reads_every_format_and_check_certificate_a_symbolic_one() -> None:
    """`govern.read_certificate` reads what `govern.certify` makes, whichever format; what
    `govern.check_certificate` returns for a symbolic certificate binds a log too."""
    data = govern.certify(_limits()).to_bytes()
    checked = govern.check_certificate(data).certificate
    log = EventLog("memory://")
    log.bind(checked)
    assert log.machine() == _limits().digest
    with pytest.raises(govern.CertificateUnreadable):
        govern.read_certificate(
            data.replace(b"govern-symbolic-certificate/1", b"govern-symbolic-certificate/9")
        )
