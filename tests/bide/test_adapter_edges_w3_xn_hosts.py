"""A `base_url` host with a label opening with "xn--" that is no IDNA encoding of a name is refused when the
model is made: httpx decodes a host that opens with such a label and failed every request on it (each
retried for nothing), and no registry hands such a label out anywhere in a name. A label that is such an
encoding, in either case, is taken, as httpx takes it."""

from __future__ import annotations

import httpx
import pytest

import bide

KINDS = ["openai", "anthropic"]

NOT_ENCODINGS = [
    "http://xn--n3h.net/v1",  # a snowman, which IDNA does not allow in a name
    "http://xn--a.com/v1",  # decodes to a control character
    "http://XN--A.com/v1",
    "http://xn--.com/v1",  # nothing encoded
    "http://xn--abc-.example/v1",  # ends with a hyphen
    "http://xn--ls8h.la:8080/v1",  # an emoji
    "http://api.xn--a.com/v1",  # in any label
    "http://user:secret-pw@xn--a.com/v1",
]

ENCODINGS = [
    "http://xn--bcher-kva.example/v1",
    "http://XN--BCHER-KVA.example./v1",
    "http://api.xn--bcher-kva.example:8080/v1",
    "http://b\u00fccher.example/v1",
    "http://xnexample.com/v1",  # "xn" without the two hyphens is a plain label
    "http://my_service:8000/v1",
]


def _make(kind: str, url: str) -> bide.OpenAIModel | bide.AnthropicModel:
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    return cls("m", api_key="", base_url=url)


@pytest.mark.parametrize("url", NOT_ENCODINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_label_that_is_no_idna_encoding_is_refused(kind: str, url: str) -> None:
    """Before, these were taken, and every request failed (httpx: "Codepoint U+2603 ... not allowed")."""
    with pytest.raises(bide.ConfigError, match="needs a base_url whose host is a host name") as caught:
        _make(kind, url)
    assert "'xn--' the IDNA encoding" in str(caught.value) and "secret-pw" not in str(caught.value)


@pytest.mark.parametrize("url", [u for u in NOT_ENCODINGS if u.lower().startswith(("http://xn--", "http://user"))])
def test_httpx_fails_on_such_a_host_itself(url: str) -> None:
    """What the refusal spares: httpx cannot even name the host of such a URL."""
    with pytest.raises(ValueError):  # idna.IDNAError
        httpx.URL(url).host  # noqa: B018


@pytest.mark.parametrize("url", ENCODINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_an_idna_encoded_label_is_taken(kind: str, url: str) -> None:
    assert _make(kind, url).base_url == url
    assert httpx.URL(url).host  # httpx reads it too
