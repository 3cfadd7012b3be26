"""A FastMCP server that the MCP binding tests register as a toolkit.

    python mcp_server.py             # over stdio
    python mcp_server.py http PORT   # streamable HTTP at http://127.0.0.1:PORT/mcp
"""

import hashlib
import os
import sys
import time

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_http_headers
from mcp import types as mcp_types

mcp = FastMCP("test-tools")


@mcp.tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@mcp.tool
def get_weather(city: str) -> dict:
    """The weather in a city."""
    return {"city": city, "sky": "clear"}


@mcp.tool
def fail(reason: str) -> str:
    """Always fails, saying why."""
    raise ToolError(f"refused: {reason}")


@mcp.tool
def slow(ms: int) -> str:
    """Answers after ms milliseconds."""
    time.sleep(ms / 1000)
    return "done"


@mcp.tool
def whoami() -> dict:
    """The server's process id and user."""
    return {"pid": os.getpid(), "uid": os.getuid()}


@mcp.tool
def auth_seen() -> str:
    """The sha256 of the Authorization header this call came with."""
    value = get_http_headers(include_all=True).get("authorization", "")
    return hashlib.sha256(value.encode()).hexdigest()


@mcp.tool
async def grow(ctx: Context) -> str:
    """Adds the tool `extra` and says the tool list changed."""

    def extra(text: str) -> str:
        """Echoes the text."""
        return text

    mcp.add_tool(extra)
    await ctx.send_notification(mcp_types.ToolListChangedNotification())
    return "grown"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False)
    else:
        print("test-tools: serving over stdio", file=sys.stderr)
        mcp.run(show_banner=False)
