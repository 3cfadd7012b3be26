"""A FastMCP (4.x) client against agentos's /mcp, driven by tests/mcp.rs.

Usage: python fastmcp_client.py URL TOKEN TOOL ARGUMENTS_JSON
Lists the tools, calls TOOL with the arguments (raise_on_error off), prints one JSON object:
tools (names), isError, data (FastMCP's parsed structured result), text.
"""

import asyncio
import json
import sys

from fastmcp import Client


async def main() -> None:
    url, token, tool, arguments = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    async with Client(url + "/mcp", auth=token) as client:
        tools = await client.list_tools()
        r = await client.call_tool(tool, arguments, raise_on_error=False)
        print(
            json.dumps(
                {
                    "tools": sorted(t.name for t in tools),
                    "isError": r.is_error,
                    "structured": r.structured_content,
                    "text": [b.text for b in r.content if getattr(b, "text", None) is not None],
                }
            )
        )


asyncio.run(main())
