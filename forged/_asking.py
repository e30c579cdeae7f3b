"""How a session asks its model: the request for a run (the system prompt, the tools, the
thinking level) or for a compaction's summary, with its key and headers resolved.

`ModelAsker` is what the run driver (`forged._run.Asking`) and a compaction
(`forged._compaction.Summaries`) are given; the session's model is its `ModelChoice`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from . import _wire as w
from ._errors import CommandError, ProviderError
from ._model_choice import ModelChoice
from ._models import ModelRegistry, clamp_level
from ._providers import Provider, ProviderRequest, ToolSpec, provider_for
from ._queues import user_message
from ._resources import Resources
from ._retry import RetrySettings
from ._tools import Tool
from ._toolset import Tools


class ModelAsker:
    """A session's requests to its model. `guidelines` are the plugins' lines for the system
    prompt, read at each request; `session_id` names the session to the provider (its
    prompt cache)."""

    def __init__(self, registry: ModelRegistry, choice: ModelChoice, resources: Resources,
                 tools: Tools, retry: RetrySettings, *,
                 guidelines: Callable[[], list[str]], session_id: Callable[[], str]) -> None:
        self._registry = registry
        self._choice = choice
        self._resources = resources
        self._tools = tools
        self._retry = retry
        self._guidelines = guidelines
        self._session_id = session_id

    @property
    def model(self) -> w.Model | None:
        return self._choice.model

    def check_can_prompt(self) -> None:
        """`CommandError` when there is no model, or no key for it."""
        if self.model is None:
            raise CommandError(self._registry.no_model_reason())
        problem = self._registry.key_problem(self.model.provider)
        if problem is not None:
            raise CommandError(problem)

    async def model_request(self, context: list[w.AgentMessage]
                            ) -> tuple[Provider, ProviderRequest]:
        """The model's request for `context`, with the session's system prompt and tools
        (MCP servers never listed before are waited for first)."""
        mcp = self._tools.mcp
        await mcp.first_listings()
        own = list(self._tools.own.values())
        return await self._request(self._resources.system_prompt(own, self._guidelines()),
                                   context, [*own, *mcp.tools.values()],
                                   self._choice.thinking_level)

    async def summary_request(self, text: str, *, max_tokens: int, reasoning: bool
                              ) -> tuple[Provider, ProviderRequest]:
        """A request for a compaction summary of `text`, to the session's model."""
        from ._compaction import SYSTEM_PROMPT

        level = clamp_level(self.model, "high") if reasoning else "off"
        return await self._request(SYSTEM_PROMPT, [user_message(text, None)], [], level,
                                   max_tokens)

    async def _request(self, system_prompt: str, messages: list[w.AgentMessage],
                       tools: list[Tool], thinking_level: str, max_tokens: int | None = None
                       ) -> tuple[Provider, ProviderRequest]:
        """The request, its key and headers resolved (``!command`` values run off the loop);
        `ProviderError` when the provider has no key."""
        model = self.model
        if model is None:
            raise CommandError(self._registry.no_model_reason())
        await self._registry.resolve(model)
        key = self._registry.api_key(model.provider)
        if key is None:
            raise ProviderError(self._registry.key_problem(model.provider)
                                or f"No API key for {model.provider}")
        request = ProviderRequest(
            model=model, system_prompt=system_prompt, messages=messages,
            tools=[ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                   for t in tools],
            thinking_level=thinking_level, api_key=key,
            headers=self._registry.request_headers(model), session_id=self._session_id(),
            idle_timeout_s=self._retry.idle_timeout_ms / 1000, max_tokens=max_tokens)
        return provider_for(model.api), request
