"""The baseline of the MCP bench: FastMCP (4.x) serving one trivial tool over Streamable HTTP.

Usage: python fastmcp_server.py PORT
"""

import sys

from fastmcp import FastMCP

mcp = FastMCP("bench")


@mcp.tool
def ping() -> dict:
    """Answer at once (the cheapest call there is)."""
    return {"pong": True}


mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
