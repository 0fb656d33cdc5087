"""Child process for the HTTP adapter crash test: a run whose model is `OpenAIModel` at a loopback server.

    python http_child.py STORE_URL BASE_URL SIGNAL_FILE

The run's first turn asks for the `wait_here` tool, which writes SIGNAL_FILE and then sleeps until the parent
kills this process with SIGKILL (the first turn is journaled by then).
"""

from __future__ import annotations

import os
import sys
import time

import bide

store_url, base_url, signal_file = sys.argv[1:4]


@bide.tool(safety=bide.ReadOnly)
def wait_here(seconds: int) -> str:
    """Wait."""
    tmp = signal_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("in the tool")
    os.replace(tmp, signal_file)
    while True:
        time.sleep(1)


model = bide.OpenAIModel("loopback", api_key="k", base_url=base_url)
agent = bide.Agent(model, store=bide.open_store(store_url), tools=[wait_here], lease_ttl=1.0)
agent.run_sync("crash-1", "go")
