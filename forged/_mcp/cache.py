"""Each server's tools and prompts as it last listed them, kept in ``<agentDir>/mcp-cache/``: a
session offers them from its first request, before the server has connected."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import attrs
import orjson

from .._codec import structure, unstructure
from .._errors import WireError
from .._log import log
from .._paths import rewrite
from .config import ServerSpec

CACHE_DIR = "mcp-cache"


@attrs.frozen(kw_only=True)
class ListedTool:
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = attrs.Factory(lambda: {"type": "object"})


@attrs.frozen(kw_only=True)
class PromptArgument:
    name: str
    description: str | None = None
    required: bool = False


@attrs.frozen(kw_only=True)
class ListedPrompt:
    name: str
    description: str | None = None
    arguments: list[PromptArgument] = attrs.Factory(list)
    """In the order the server declares them: a command's arguments fill them so."""


@attrs.frozen(kw_only=True)
class Listing:
    tools: list[ListedTool]
    resources: bool = False
    prompts: list[ListedPrompt] = attrs.Factory(list)


class ListingCache:
    """Each server's `Listing` as it last connected, one file per way of reaching a server
    (its command or URL, arguments, environment and headers, as written: a secret in a
    ``${VAR}`` is not expanded, and the file name is a hash). Read and written in worker
    threads; a missing or unreadable file is no listing."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        """None: nothing is kept (``forged mcp list`` of a bare configuration)."""

    def _path(self, spec: ServerSpec) -> Path | None:
        if self.folder is None:
            return None
        reached = [spec.transport, spec.command, spec.args, spec.env, spec.cwd, spec.url,
                   spec.headers]
        digest = hashlib.sha256(orjson.dumps(reached)).hexdigest()[:32]
        return self.folder / f"{digest}.json"

    def read(self, spec: ServerSpec) -> Listing | None:
        path = self._path(spec)
        if path is None:
            return None
        try:
            return structure(orjson.loads(path.read_bytes()), Listing)
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError, WireError) as exc:
            log(f"MCP server {spec.name}: its cached tool list {path} is unreadable ({exc})")
            return None

    def write(self, spec: ServerSpec, listing: Listing) -> None:
        path = self._path(spec)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            rewrite(path, orjson.dumps(unstructure(listing)), durable=False)
        except OSError as exc:
            log(f"MCP server {spec.name}: cannot keep its tool list in {path} ({exc})")
