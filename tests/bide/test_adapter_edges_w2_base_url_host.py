"""A `base_url` whose host is no host (a character no host name holds, an empty label, an IPv4 address out
of range, an IPv6 address that is not one) is refused with `ConfigError` when the model is made, not taken
and then failed on at every request. A host name (its labels letters, digits, "-" and "_"; a name in
another script, as IDNA encodes it), an IPv4 address and an IPv6 address in brackets are taken."""

from __future__ import annotations

import pytest

import bide

KINDS = ["openai", "anthropic"]

NOT_HOSTS = [
    "http://local%20host:8080/v1",  # a space, percent-encoded
    "http://ex<ample.com/v1",
    'http://exa"mple.com/v1',
    "http://exa{mple}.com/v1",
    "http://a|b/v1",
    "http://api..example.com/v1",  # an empty label
    "http://.example.com/v1",
    "http://" + "a" * 64 + ".com/v1",  # a label past 63 characters
    "http://" + ".".join(["a" * 60] * 5) + "/v1",  # a name past 253 characters
    "http://1.2.3.999:8080/v1",
    "http://256.0.0.1/v1",
    "http://[zz]:8080/v1",
    "http://[::1/v1",
    "http://[::1]x:8080/v1",
    "http://[fe80::1%25eth%200]:8080/v1",  # a zone that is no interface name
    "http://\U0001f600.com/v1",  # no IDNA name
    "http://user:secret-pw@bad%host:8080/v1",
]

HOSTS = [
    "http://localhost:8080/v1",
    "http://127.0.0.1:8080/v1",
    "http://[::1]:8080/v1",
    "http://[::1]/v1",
    "http://[fe80::1%25eth0]:8080/v1",
    "http://my_service:8000/v1",  # Docker Compose names services with "_"
    "http://host.docker.internal:11434/v1",
    "http://example.com./v1",  # the DNS root's dot
    "http://b\u00fccher.example:8080/v1",
    "http://proxyuser:p%40ss@gateway.internal:8443/v1",
]


def _make(kind: str, url: str) -> bide.OpenAIModel | bide.AnthropicModel:
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    return cls("m", api_key="", base_url=url)


@pytest.mark.parametrize("url", NOT_HOSTS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_base_url_whose_host_is_no_host_is_refused_when_the_model_is_made(kind: str, url: str) -> None:
    """Before, these were taken (or, for "[zz]", refused as a bad port): every request failed and was
    retried. Now ConfigError says what a host is, without repeating the URL (it may hold credentials)."""
    with pytest.raises(bide.ConfigError, match="needs a base_url whose host is a host name") as caught:
        _make(kind, url)
    assert "an IPv4 address or an IPv6 address in brackets" in str(caught.value)
    assert "secret-pw" not in str(caught.value)


@pytest.mark.parametrize("url", HOSTS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_base_url_with_a_host_is_taken(kind: str, url: str) -> None:
    assert _make(kind, url).base_url == url


def test_a_space_in_the_host_is_refused() -> None:
    """Unchanged: a space itself is white space, refused as such."""
    with pytest.raises(bide.ConfigError, match="without white space"):
        _make("anthropic", "http://local host:8080")


def test_the_other_checks_still_say_what_they_said() -> None:
    """No host at all, and a port that is no port, keep their own messages."""
    with pytest.raises(bide.ConfigError, match="that names a host"):
        _make("openai", "http://:8080/v1")
    with pytest.raises(bide.ConfigError, match="port is a number"):
        _make("openai", "http://example.com:99999/v1")
