"""Model settings that every request would fail on are refused when the model is made (`bide.ConfigError`,
saying what is wrong and what is accepted), not at each run with "run again to retry": a `retry` that is
not a `bide.RetryPolicy`, a `max_retries` that is not a whole number from 0, a `temperature` that is no
finite number, an `extra_body` that is not a dict of JSON values, a `base_url` without a host."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import bide
from bide.testing import LoopbackServer, Received, Reply, anthropic_message, openai_completion

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]
KINDS = ["openai", "anthropic"]

_JSON_ONLY = r"extra_body to hold only JSON values .*"
# (the setting, what the error says)
_BAD: dict[str, tuple[dict[str, Any], str]] = {
    "retry=3": ({"retry": 3}, r"needs retry, a bide\.RetryPolicy .*not 3"),
    "max_retries=None": ({"max_retries": None}, r"needs max_retries, a whole number of retries .*not None"),
    "max_retries=-1": ({"max_retries": -1}, r"needs max_retries, a whole number .*not -1"),
    "temperature=nan": ({"temperature": math.nan}, r"needs temperature, a finite number .*not nan"),
    "temperature=inf": ({"temperature": math.inf}, r"needs temperature, a finite number .*not inf"),
    "temperature='0.7'": ({"temperature": "0.7"}, r"needs temperature, a finite number .*not '0\.7'"),
    "extra_body inf": ({"extra_body": {"top_p": math.inf}}, _JSON_ONLY + "Out of range"),
    "extra_body object": ({"extra_body": {"x": object()}}, _JSON_ONLY + "not JSON"),
    "extra_body surrogate": ({"extra_body": {"x": "\ud800"}}, _JSON_ONLY + "surrogates"),
    "extra_body=[1]": ({"extra_body": [1]}, r"needs extra_body, a dict of field names .*not a list"),
    "extra_body key 1": ({"extra_body": {1: 2}}, r"needs extra_body, a dict of field names .*the key 1"),
    "base_url no host": ({"base_url": "http:///v1"}, r"needs a base_url that names a host"),
    "base_url port only": ({"base_url": "http://:8080/v1"}, r"needs a base_url that names a host"),
    # An integer past a float's range raised a bare OverflowError; a line break kept from the file or
    # variable a URL was read from failed every request, not retried.
    "temperature=10**400": ({"temperature": 10**400}, r"needs temperature, a finite number"),
    "base_url line break": ({"base_url": "http://127.0.0.1:9/v1\n"}, r"without white space or control"),
    "base_url tab": ({"base_url": "http://127.0.0.1:9/\tv1"}, r"without white space or control"),
}


def _make(kind: str, **settings: Any) -> bide.OpenAIModel | bide.AnthropicModel:
    settings.setdefault("base_url", "http://127.0.0.1:9/v1")
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    return cls("m", api_key="k", **settings)


@pytest.mark.parametrize("case", list(_BAD))
@pytest.mark.parametrize("kind", KINDS)
def test_an_unusable_setting_is_refused_when_the_model_is_made(kind: str, case: str) -> None:
    """Before, these were taken, and every run failed on them ("run again to retry", for ever: a
    ModelError naming no setting, or a bare TypeError from the constructor for max_retries=None and
    extra_body=[1]). Now the constructor raises ConfigError naming the setting and what it takes."""
    settings, says = _BAD[case]
    with pytest.raises(bide.ConfigError, match=says):
        _make(kind, **settings)


def test_a_base_url_without_a_host_is_not_repeated_in_the_error() -> None:
    """The URL may hold a proxy's credentials: the error names what is missing, not the URL."""
    with pytest.raises(bide.ConfigError) as caught:
        _make("openai", base_url="http://proxyuser:hunter22@/v1")
    assert "hunter22" not in str(caught.value)


@pytest.mark.parametrize("kind", KINDS)
def test_usable_settings_are_kept_and_sent(serve: Serve, kind: str) -> None:
    """Unchanged: a finite temperature (0 too), extra_body of JSON values, max_retries=0 and a policy in
    `retry` are taken, and the request carries the temperature and the extra fields."""
    extra = {"top_p": 0.5, "metadata": {"tags": ["a", None, 1], "ok": True}}
    reply = openai_completion("hi") if kind == "openai" else anthropic_message("hi")
    server = serve(lambda request: reply)
    url = f"{server.url}/v1" if kind == "openai" else server.url
    model = _make(kind, base_url=url, temperature=0, extra_body=extra, max_retries=0)
    assert model.retry.attempts == 1
    assert _make(kind, retry=bide.RetryPolicy(attempts=2)).retry.attempts == 2
    agent = bide.Agent(model, store=bide.open_store("memory://"))
    assert agent.run_sync("r1", "hello").answer == "hi"
    (request,) = server.requests
    assert request.body["temperature"] == 0
    assert {k: request.body[k] for k in extra} == extra
