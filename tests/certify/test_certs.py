"""The committed certificates in certs/ are current and check, and the published schema matches the format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from govern.certificate._model import (
    BoolVariable,
    CertificateModel,
    EnumVariable,
    EventRule,
    IntVariable,
    InvariantRule,
    MachineRules,
    SignatureBlock,
    Tables,
    ToolInfo,
    Verdict,
)

from .conftest import govern
from .regenerate import CERTS, ROOT, SUFFIX, expected_certificates

SCHEMA = CERTS / "schema" / "govern-certificate-1.schema.json"


def test_committed_certificates_are_current() -> None:
    expected, _rejected = expected_certificates()
    assert expected, "no machine to certify: examples/ and the benchmark list are empty"
    committed = {p.name: p.read_bytes() for p in CERTS.glob("*" + SUFFIX)}
    missing = sorted(set(expected) - set(committed))
    stale = sorted(n for n in set(expected) & set(committed) if expected[n] != committed[n])
    orphans = sorted(set(committed) - set(expected))
    assert not (missing or stale or orphans), (
        f"certs/ is out of date (missing {missing}, stale {stale}, no machine for {orphans}); "
        "run `python3 tests/certify/regenerate.py` and commit the result"
    )


def test_every_committed_certificate_checks() -> None:
    files = sorted(CERTS.glob("*" + SUFFIX))
    assert files
    for path in files:
        result = govern("check", str(path), "--json", cwd=ROOT)
        assert result.returncode == 0, (path.name, result.stdout, result.stderr)
        report = json.loads(result.stdout)
        assert report["valid"] is True and report["machine"] in path.name


def _fields(model: type[BaseModel]) -> tuple[set[str], set[str]]:
    names = set(model.model_fields)
    required = {n for n, f in model.model_fields.items() if f.is_required()}
    return names, required


def _check(schema_object: dict[str, Any], model: type[BaseModel]) -> None:
    names, required = _fields(model)
    assert schema_object["additionalProperties"] is False, model.__name__
    assert set(schema_object["properties"]) == names, model.__name__
    assert set(schema_object["required"]) == required, model.__name__


def test_schema_describes_the_same_fields_as_the_reader() -> None:
    schema = json.loads(SCHEMA.read_text())
    defs = schema["$defs"]
    _check(schema, CertificateModel)
    _check(schema["properties"]["tool"], ToolInfo)
    _check(schema["properties"]["tables"], Tables)
    _check(schema["properties"]["signature"], SignatureBlock)
    _check(defs["machine"], MachineRules)
    _check(defs["verdict"], Verdict)
    variants = defs["machine"]["properties"]["variables"]["items"]["oneOf"]
    kinds: tuple[type[BaseModel], ...] = (BoolVariable, EnumVariable, IntVariable)
    for variant, model in zip(variants, kinds, strict=True):
        _check(variant, model)
    _check(defs["machine"]["properties"]["invariants"]["items"], InvariantRule)
    _check(defs["machine"]["properties"]["events"]["items"], EventRule)
    ops = set()
    for alternative in defs["expression"]["oneOf"]:
        ops |= set(alternative["prefixItems"][0]["enum"])
    from govern.certificate._model import ARITY

    assert ops == set(ARITY)


def test_committed_certificates_follow_the_schema_shape() -> None:
    schema = json.loads(SCHEMA.read_text())
    for path in sorted(CERTS.glob("*" + SUFFIX)):
        document = json.loads(path.read_bytes())
        assert set(schema["required"]) <= set(document) <= set(schema["properties"])
        assert document["format"] == schema["properties"]["format"]["const"]


def test_schema_file_is_canonical_enough_to_publish() -> None:
    schema = json.loads(SCHEMA.read_text())
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert Path(SCHEMA).name == "govern-certificate-1.schema.json"
