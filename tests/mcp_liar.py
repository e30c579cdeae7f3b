"""A stdio MCP server that lies, written by hand (the SDK's server side would not send what it
sends)::

    python mcp_liar.py endless     its tools/list pages never end: each names the same next
                                   cursor and repeats the tools
    python mcp_liar.py array       it offers a tool whose schema is an array's as well
    python mcp_liar.py noisy       it writes a line that is not JSON-RPC before each answer
    python mcp_liar.py huge SIZE   each echo answers with SIZE bytes of text
    python mcp_liar.py endless-line SIZE
                                   each echo's answer is a line it never ends: SIZE bytes,
                                   then it waits for ever
    python mcp_liar.py orphan FILE it starts a sleep (its pid into FILE) in the server's
                                   process group, and exits at the end of stdin without it

Its one good tool is ``echo``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
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


def endless_line(message: dict[str, Any], size: int) -> None:
    opening = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {
        "content": [{"type": "text", "text": ""}]}})
    sys.stdout.write(opening[:opening.rindex('"')])  # the text's closing quote, and on
    sys.stdout.write("x" * size)
    sys.stdout.flush()
    time.sleep(3600)


def main() -> None:
    if sys.argv[1] == "orphan":
        child = subprocess.Popen(["sleep", "300"])  # in the server's process group
        with open(sys.argv[2], "w") as file:
            file.write(str(child.pid))
    for line in sys.stdin:
        message = json.loads(line)
        if sys.argv[1] == "noisy":
            print("this is not JSON-RPC", flush=True)
        if sys.argv[1] == "endless-line" and message.get("method") == "tools/call":
            endless_line(message, int(sys.argv[2]))
        if sys.argv[1] == "huge" and message.get("method") == "tools/call":
            message["params"]["arguments"]["text"] = "x" * int(sys.argv[2])
        if "id" in message and "method" in message:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
            print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
