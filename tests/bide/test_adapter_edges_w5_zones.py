"""An IPv6 zone in `base_url`, written as RFC 6874 says (``[fe80::1%25eth0]``): on a link-local address the
request is sent to the zone as httpx hands it to the resolver (``fe80::1%eth0``, which it resolves), not
as written (the resolver found no host "fe80::1%25eth0", and every request failed); on any other address,
where the resolver takes no zone, the model is refused when it is made (ConfigError)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
from raw_http import one_turn

import bide

KINDS = ["openai", "anthropic"]
# An interface every machine has (the loopback one, on Linux "lo"): a zone names an interface.
INTERFACE = socket.if_nameindex()[0][1]


def _make(kind: str, url: str, **options: Any) -> bide.OpenAIModel | bide.AnthropicModel:
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    return cls("m", api_key="", base_url=url, **options)


@pytest.mark.parametrize("kind", KINDS)
def test_a_zoned_link_local_address_is_asked_as_the_resolver_reads_it(kind: str) -> None:
    """Before, httpx was handed the host "fe80::1%25lo"; now "fe80::1%lo", with `base_url` kept as given."""
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        raise httpx.ConnectError("stop here")

    url = f"http://user:pw@[fe80::1%25{INTERFACE}]:8080/v1"
    model = _make(kind, url, max_retries=0, transport=httpx.MockTransport(answer))
    assert model.base_url == url
    with pytest.raises(bide.ModelError):
        asyncio.run(one_turn(model, False))
    assert seen == [f"fe80::1%{INTERFACE}"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_zoned_link_local_address_is_resolved(kind: str) -> None:
    """A real request (no server listens at fe80::1, so it cannot connect): before, it failed at the
    resolver ("[Errno -2] Name or service not known"), which took "%25lo" for part of a host name; now the
    address resolves and the failure is the connection's."""
    model = _make(kind, f"http://[fe80::1%25{INTERFACE}]:9/v1", max_retries=0, timeout=5)
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, False))
    said = str(caught.value)
    assert "ConnectError" in said, said
    assert "Name or service not known" not in said and "Errno -2" not in said, said
    # What httpx is handed resolves, with the zone's interface as the address's scope.
    resolved = socket.getaddrinfo(httpx.URL(model._url()).host, 9, type=socket.SOCK_STREAM)
    assert resolved[0][4][-1] == socket.if_nametoindex(INTERFACE)


OFF_LINK = [
    f"http://[::1%25{INTERFACE}]:8080/v1",
    "http://[fd00::2%25eth0]:8080/v1",
    "http://[2001:db8::1%25eth0]/v1",
    f"http://user:secret-pw@[::1%{INTERFACE}]:8080/v1",  # the zone's "%" not encoded: the same address
]


@pytest.mark.parametrize("url", OFF_LINK)
@pytest.mark.parametrize("kind", KINDS)
def test_a_zone_on_an_address_that_is_not_link_local_is_refused(kind: str, url: str) -> None:
    """Before, taken, and every request failed at the resolver (retried for nothing): it takes a zone on a
    link-local address only. Now ConfigError says so, without repeating the URL."""
    with pytest.raises(bide.ConfigError, match="IPv6 zone") as caught:
        _make(kind, url)
    said = str(caught.value)
    assert "link-local address (fe80::/10)" in said and "remove the zone" in said, said
    assert "secret-pw" not in said
    host = httpx.URL(url.replace("%25", "%")).host
    with pytest.raises(socket.gaierror):  # what made every request fail
        socket.getaddrinfo(host, 8080)


@pytest.mark.parametrize("kind", KINDS)
def test_addresses_without_a_zone_are_sent_as_they_are(kind: str) -> None:
    for url in ("http://[::1]:8080/v1", "http://[fe80::1]:8080/v1", "http://u:p%25w@127.0.0.1:8080/v1"):
        assert _make(kind, url)._url().startswith(f"{url}/")
