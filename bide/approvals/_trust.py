"""`ApprovalTrust`: the approval policy an auditor trusts, given from outside the evidence package.

An evidence package carries the policy its gates counted under (in the request record), but whoever holds
the log's key writes that record: they could gate a run with keys of their own named alice, bob and carol,
and the recount would match. Pinning says which policy counts: by its digest, by the exact approvers (name
and public key) and optionally k, or by a policy file. A gate under any other policy is refused
(`UntrustedPolicy`, exit 5 of `bide-audit verify-approvals`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ..audit._errors import NotVerified, UnreadableInput
from ..audit._keys import PublicKey
from ..audit._strict import strict_json
from ._policy import KEY_ID_HINT, ApprovalPolicy, load_approver_key

__all__ = ["ApprovalTrust", "UntrustedPolicy"]

_MAX_POLICY_FILE = 1024 * 1024


class UntrustedPolicy(NotVerified):
    """The package's gates check out, but under a policy other than the one the auditor pinned: the
    approvers who counted are not the ones trusted. Treat the approval as not given."""


@dataclass(frozen=True)
class ApprovalTrust:
    """What an auditor trusts. Every constraint given must hold for a gate to count:

    - `policy_digests`: the policy's digest (hex) is one of these;
    - `approvers`: the policy's seats are exactly these names with these keys;
    - `need`: the policy needs exactly this many approvals.

    `ApprovalTrust()` pins nothing (the package's own policy is taken as given, and the output says so).
    """

    policy_digests: frozenset[str] = frozenset()
    approvers: Mapping[str, PublicKey] | None = None
    need: int | None = None

    @property
    def pinned(self) -> bool:
        """True when the approvers are pinned (a policy digest or the seats): `need` alone says how many
        approvals a gate needs, not whose they are, so a policy of anyone's keys would pass it."""
        return bool(self.policy_digests) or self.approvers is not None

    @property
    def need_pinned(self) -> bool:
        """True when how many approvals a gate needs is pinned: by `need`, or by a policy digest (which
        covers the whole policy)."""
        return bool(self.policy_digests) or self.need is not None

    @classmethod
    def of(
        cls,
        *,
        policy_digests: Iterable[str] = (),
        approvers: Iterable[str] | Mapping[str, PublicKey | str] | None = None,
        need: int | None = None,
        policy_files: Iterable[str | os.PathLike[str]] = (),
    ) -> ApprovalTrust:
        """Build a trust from command-line shaped input: digests as 64 hex characters, approvers as
        ``NAME=KEY`` strings split at the first '=' (a name bide takes for a new policy holds none; or a
        mapping; KEY is 64 hex characters or a public key PEM file), policy files
        as paths (see `policy_from_file`). The digests and the policy files are one pin: a gate's policy
        must be one of them (several allow a rotation). Raises `ConfigError` for malformed input,
        `UnreadableInput` for an unreadable key or policy file."""
        digests = set()
        for d in policy_digests:
            text = d.lower()
            if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
                raise ConfigError(f"a policy digest is 64 hex characters, got {d!r}")
            digests.add(text)
        for path in policy_files:
            digests.add(policy_from_file(path).digest.hex())
        seats: dict[str, PublicKey] | None = None
        if approvers is not None:
            pairs: list[tuple[str, PublicKey | str]] = []
            if isinstance(approvers, Mapping):
                pairs = list(approvers.items())
            else:
                for spec in approvers:
                    name, sep, key = spec.partition("=")
                    if not sep or not name or not key:
                        raise ConfigError(f"--approver takes NAME=KEY, got {spec!r}")
                    pairs.append((name, key))
            seats = {}
            for name, spec_key in pairs:
                if name in seats:
                    raise ConfigError(f"approver {name!r} is pinned twice")
                seats[name] = (
                    spec_key if isinstance(spec_key, PublicKey) else _load_pinned_key(name, spec_key)
                )
            if not seats:
                seats = None
        if need is not None and (isinstance(need, bool) or not isinstance(need, int) or need < 1):
            raise ConfigError(f"the pinned need must be a positive integer, got {need!r}")
        return cls(frozenset(digests), seats, need)

    def problem(self, policy: ApprovalPolicy) -> str | None:
        """Why `policy` is not trusted, or None when every pinned constraint holds."""
        digest = policy.digest.hex()
        if self.policy_digests and digest not in self.policy_digests:
            pinned = ", ".join(sorted(self.policy_digests))
            return f"its policy digest {digest} is not one you pinned ({pinned})"
        if self.approvers is not None:
            have = {a.name: a.key.raw for a in policy.approvers}
            want = {name: key.raw for name, key in self.approvers.items()}
            if have != want:
                other_key = sorted(n for n in have if n in want and want[n] != have[n])
                extra = sorted(n for n in have if n not in want)
                missing = sorted(n for n in want if n not in have)
                # A key id that happens to decode as a key: the pinned "key" is the hash of the seat's key.
                ids = sorted(n for n in other_key if hashlib.sha256(have[n]).digest() == want[n])
                return (
                    "its approvers are not the ones you pinned"
                    + (f" (seats under another key than pinned: {', '.join(other_key)})" if other_key else "")
                    + (f" (seats not pinned: {', '.join(extra)})" if extra else "")
                    + (f" (pinned seats it lacks: {', '.join(missing)})" if missing else "")
                    + (
                        f"; the key pinned for {', '.join(ids)} is the key id of the package's key for that "
                        f"seat, not a public key: {KEY_ID_HINT}"
                        if ids
                        else ""
                    )
                )
        if self.need is not None and policy.need != self.need:
            return f"it needs {policy.need} approvals, you pinned {self.need}"
        return None


def _load_pinned_key(name: str, spec: str) -> PublicKey:
    try:
        return load_approver_key(name, spec)
    except UnreadableInput as exc:
        if "=" not in spec:
            raise
        # "ops=1=KEY" reads as name "ops" and key file "1=KEY".
        raise UnreadableInput(
            f"{exc}; NAME=KEY is split at the first '=', so a seat whose name holds '=' (which only a policy "
            "recorded by an older bide has) cannot be pinned this way: pin its policy with --policy FILE or "
            "--policy-digest"
        ) from exc


def policy_from_file(path: str | os.PathLike[str]) -> ApprovalPolicy:
    """Read a policy file: the JSON of a request record's ``policy`` member,
    ``{"need": k, "approvers": [{"name": ..., "public_key": 64 hex}, ...]}`` (read strictly)."""
    from ..audit._input import read_limited

    try:
        data = read_limited(path, _MAX_POLICY_FILE)
    except OSError as exc:
        raise UnreadableInput(f"cannot read policy file {os.fspath(path)!r}: {exc.strerror or exc}") from exc
    value: Any = strict_json(data, what=f"policy file {os.fspath(path)!r}", max_bytes=_MAX_POLICY_FILE)
    try:
        return ApprovalPolicy.from_json(value, recorded=True)
    except ConfigError as exc:
        raise UnreadableInput(f"policy file {os.fspath(path)!r} is not a valid policy: {exc}") from exc
