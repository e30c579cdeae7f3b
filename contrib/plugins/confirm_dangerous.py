"""A forged plugin: ask the user before the model runs a dangerous bash command.

Before every ``bash`` tool call whose command matches one of the patterns, the client is
asked to ``confirm``. The call runs only if the user confirms; a decline, a dismissed
dialog or no answer within the timeout blocks it, and the model is told why.

Install it for every project by copying it into ``<agentDir>/plugins/``, or for one run with
``forged --plugin contrib/plugins/confirm_dangerous.py``. Options, in settings.json::

    {"confirmDangerous": {"patterns": ["\\\\brm\\\\s+-\\\\w*r\\\\w*f", "\\\\bgit\\\\s+push\\\\s+--force"],
                          "timeoutSeconds": 60}}

``patterns`` are Python regular expressions searched for in the command; the default catches
``rm -rf`` and its spellings (``rm -fr``, ``rm -Rf``, ``rm -r -f``).
"""

from __future__ import annotations

import re
from typing import Any

_FLAGS = r"(?:-\w+\s+)*"
DEFAULT_PATTERNS = [
    rf"\brm\s+{_FLAGS}-\w*(?:[rR]\w*f|f\w*[rR])",  # rm -rf, -fr, -Rf, rm -v -rf
    rf"\brm\s+{_FLAGS}-\w*[rR]\w*\s+{_FLAGS}-\w*f",  # rm -r -f
    rf"\brm\s+{_FLAGS}-\w*f\w*\s+{_FLAGS}-\w*[rR]",  # rm -f -r
    r"\brm\s+.*--recursive",
]
DEFAULT_TIMEOUT_S = 60.0


def register(api: Any) -> None:
    options = api.settings.get("confirmDangerous")
    options = options if isinstance(options, dict) else {}
    patterns = [re.compile(p) for p in options.get("patterns", DEFAULT_PATTERNS)]
    timeout_s = float(options.get("timeoutSeconds", DEFAULT_TIMEOUT_S))

    async def before_tool_call(call: Any, ctx: Any) -> Any:
        command = call.args.get("command")
        if call.tool_name != "bash" or not isinstance(command, str):
            return None
        if not any(pattern.search(command) for pattern in patterns):
            return None
        if await ctx.ui.confirm("Allow dangerous command?", command, timeout_s=timeout_s):
            return None
        ctx.ui.notify(f"Blocked: {command}", "warning")
        return api.block(f"The user did not allow this command: {command}")

    api.on("before_tool_call", before_tool_call)
