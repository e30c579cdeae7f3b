"""A stdio MCP server that lies, written by hand (the SDK's server side would not send what it
sends)::

    python mcp_liar.py endless     its tools/list pages never end: each names the same next
                                   cursor and repeats the tools
    python mcp_liar.py array       it offers a tool whose schema is an array's as well
    python mcp_liar.py noisy       it writes a line that is not JSON-RPC before each answer

Its one good tool is ``echo``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

ECHO = {"name": "echo", "description": "Echo the text back", "inputSchema": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
ODD = {"name": "odd", "description": "An array's schema", "inputSchema": {"type": "array"}}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    method, params = request["method"], request.get("params") or {}
    if method == "initialize":
        return {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "liar", "version": "1"}}
    if method == "tools/list":
        if sys.argv[1] == "array":
            return {"tools": [ECHO, ODD]}
        return {"tools": [ECHO], "nextCursor": "again"}
    if method == "tools/call":
        text = params["arguments"]["text"]
        return {"content": [{"type": "text", "text": f"liar echo: {text}"}]}
    return {}


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if sys.argv[1] == "noisy":
            print("this is not JSON-RPC", flush=True)
        if "id" in message and "method" in message:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
            print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
