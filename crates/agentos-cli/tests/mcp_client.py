"""An MCP client of the official Python SDK (`mcp` 2.x) against agentos, driven by tests/mcp.rs.

Usage: python mcp_client.py '<json>' with
  transport  "http" (Streamable HTTP at {url}/mcp, bearer {token}) or "stdio" (`{bin} mcp`, which
             reaches the master through AGENTOS_URL and AGENTOS_TOKEN)
  mode       the SDK's connect mode: "legacy" (initialize handshake) or "auto" (2026-07-28 when
             the server offers it)
  calls      [[tool, arguments], ...] called in order after the first tools/list
  register   optional: a command body POSTed to {url}/api/commands with {operator} once the client
             listens for changes; the client then waits (10 s at most) to be told its tools
             changed, and lists them again
Prints one JSON object: tools (names), schemas, calls (isError, text, structured), and, after a
registration, changed (whether the server said so) and tools_after.
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def main() -> None:
    cfg = json.loads(sys.argv[1])
    changed = asyncio.Event()

    async def on_message(message) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()

    if cfg["transport"] == "http":
        headers = {"Authorization": "Bearer " + cfg["token"]}
        server = streamable_http_client(cfg["url"] + "/mcp", http_client=create_mcp_http_client(headers=headers))
    else:
        env = {"AGENTOS_URL": cfg["url"], "AGENTOS_TOKEN": cfg["token"], "PATH": "/usr/bin:/bin"}
        server = StdioServerParameters(command=cfg["bin"], args=["mcp"], env=env)

    out: dict = {}
    async with Client(server, mode=cfg["mode"], message_handler=on_message, read_timeout_seconds=30) as client:
        out["protocol"] = client.session.protocol_version
        listed = await client.list_tools()
        out["tools"] = sorted(t.name for t in listed.tools)
        out["schemas"] = {t.name: t.input_schema for t in listed.tools}
        out["calls"] = []
        for name, arguments in cfg.get("calls", []):
            r = await client.call_tool(name, arguments)
            out["calls"].append(
                {
                    "name": name,
                    "isError": r.is_error,
                    "text": [b.text for b in r.content if getattr(b, "text", None) is not None],
                    "structured": r.structured_content,
                }
            )
        if cfg.get("register"):

            async def register() -> None:
                async with httpx2.AsyncClient() as http:
                    r = await http.post(
                        cfg["url"] + "/api/commands",
                        json=cfg["register"],
                        headers={"Authorization": "Bearer " + cfg["operator"]},
                    )
                    assert r.status_code == 200, r.text

            if out["protocol"] >= "2026-07-28":
                async with client.listen(tools_list_changed=True) as sub:
                    await register()
                    try:
                        async with asyncio.timeout(10):
                            async for _event in sub:
                                changed.set()
                                break
                    except TimeoutError:
                        pass
            else:
                await register()
                try:
                    await asyncio.wait_for(changed.wait(), 10)
                except TimeoutError:
                    pass
            out["changed"] = changed.is_set()
            # A 2026-07-28 client caches lists; the server says they are not to be cached.
            after = await client.list_tools()
            out["tools_after"] = sorted(t.name for t in after.tools)
    print(json.dumps(out))


asyncio.run(main())
