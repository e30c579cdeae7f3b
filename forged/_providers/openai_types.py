"""OpenAI's two wire APIs as types: the request bodies forged sends (``*Param``, ``ChatParams``,
``ResponsesParams``: TypedDicts whose keys are sent in the order they are built) and the stream
events it reads (``*Event``, ``ChatChunk``), with the one reader of each stream (`chat_chunk`,
`responses_event`). OpenAI-compatible endpoints send more than these fields; forged reads only
these. Used by `forged._providers.openai`, and by Azure's and Codex's Responses.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict, cast

from .sse import json_object

# --- Chat Completions: the request -----------------------------------------------------------


class CacheControlParam(TypedDict):
    type: Literal["ephemeral"]


class TextPartParam(TypedDict):
    type: Literal["text"]
    text: str
    cache_control: NotRequired[CacheControlParam]


class ImageUrlParam(TypedDict):
    url: str


class ImagePartParam(TypedDict):
    type: Literal["image_url"]
    image_url: ImageUrlParam


ChatContentParam = str | list[TextPartParam | ImagePartParam]


class FunctionParam(TypedDict):
    name: str
    arguments: str


class ToolCallParam(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionParam


class SystemMessageParam(TypedDict):
    role: Literal["system", "developer"]
    content: ChatContentParam


class UserMessageParam(TypedDict):
    role: Literal["user"]
    content: ChatContentParam


class AssistantMessageParam(TypedDict):
    role: Literal["assistant"]
    content: ChatContentParam | None
    reasoning_content: NotRequired[str]
    tool_calls: NotRequired[list[ToolCallParam]]


class ToolMessageParam(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    content: ChatContentParam


ChatMessageParam = (SystemMessageParam | UserMessageParam | AssistantMessageParam
                    | ToolMessageParam)


class FunctionSpecParam(TypedDict):
    name: str
    description: str
    parameters: dict[str, object]


class ChatToolParam(TypedDict):
    type: Literal["function"]
    function: FunctionSpecParam
    cache_control: NotRequired[CacheControlParam]


class StreamOptionsParam(TypedDict):
    include_usage: bool


class ChatThinkingParam(TypedDict):
    type: Literal["enabled", "disabled"]
    clear_thinking: NotRequired[bool]


class ChatReasoningParam(TypedDict, total=False):
    effort: str
    enabled: bool


class ChatParams(TypedDict):
    """A Chat Completions request's body, its keys in the order they are sent; the thinking
    fields are each endpoint's own (`thinking_params`)."""

    model: str
    messages: list[ChatMessageParam]
    stream: bool
    stream_options: NotRequired[StreamOptionsParam]
    max_tokens: NotRequired[int]
    max_completion_tokens: NotRequired[int]
    store: NotRequired[bool]
    tools: NotRequired[list[ChatToolParam]]
    tool_stream: NotRequired[bool]
    thinking: NotRequired[ChatThinkingParam | str]
    enable_thinking: NotRequired[bool]
    chat_template_kwargs: NotRequired[object]
    """models.json's template arguments, filled in (`_template_values`)."""
    chat_template_args: NotRequired[object]
    reasoning_effort: NotRequired[str]
    reasoning: NotRequired[ChatReasoningParam]


# --- Chat Completions: the stream ------------------------------------------------------------

class ChatUsageDetailsEvent(TypedDict, total=False):
    cached_tokens: int | None


class ChatUsageEvent(TypedDict, total=False):
    prompt_tokens: int | None
    completion_tokens: int | None
    prompt_tokens_details: ChatUsageDetailsEvent | None


class FunctionEvent(TypedDict, total=False):
    name: str
    arguments: str | None


class ToolCallEvent(TypedDict, total=False):
    index: int
    id: str | None
    function: FunctionEvent | None


class DeltaEvent(TypedDict, total=False):
    content: str | None
    reasoning_content: str | None
    reasoning: str | None
    reasoning_text: str | None
    tool_calls: list[ToolCallEvent] | None


class ChoiceEvent(TypedDict, total=False):
    delta: DeltaEvent | None
    finish_reason: str | None


class ErrorEvent(TypedDict, total=False):
    message: str | None


class ChatChunk(TypedDict, total=False):
    """One chunk of a Chat Completions stream (an error, the usage, the choices' deltas)."""

    error: ErrorEvent | None
    usage: ChatUsageEvent | None
    choices: list[ChoiceEvent] | None


def chat_chunk(data: object) -> ChatChunk:
    """The reader of the Chat Completions stream: a decoded chunk as a `ChatChunk`."""
    return cast(ChatChunk, json_object(data))


# --- Responses: the request ------------------------------------------------------------------

class InputTextParam(TypedDict):
    type: Literal["input_text"]
    text: str


class InputImageParam(TypedDict):
    type: Literal["input_image"]
    detail: Literal["auto"]
    image_url: str


class UserItemParam(TypedDict):
    role: Literal["user"]
    content: list[InputTextParam | InputImageParam]


class DeveloperItemParam(TypedDict):
    role: Literal["developer"]
    content: str


class OutputTextParam(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[object]


class AssistantItemParam(TypedDict):
    type: Literal["message"]
    role: Literal["assistant"]
    status: Literal["completed"]
    content: list[OutputTextParam]
    id: NotRequired[str]


class FunctionCallItemParam(TypedDict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: NotRequired[str]


class FunctionCallOutputItemParam(TypedDict):
    type: Literal["function_call_output"]
    call_id: str
    output: str


ReasoningItemParam = dict[str, object]
"""A reasoning item as the service sent it (kept as its thinking block's signature)."""


InputItemParam = (UserItemParam | DeveloperItemParam | AssistantItemParam | FunctionCallItemParam
                  | FunctionCallOutputItemParam | ReasoningItemParam)


class ResponsesToolParam(TypedDict):
    type: Literal["function"]
    name: str
    description: str
    parameters: dict[str, object]
    strict: bool


class ReasoningParam(TypedDict):
    effort: str
    summary: NotRequired[Literal["auto"]]


class ResponsesParams(TypedDict):
    """A Responses request's body, its keys in the order they are sent."""

    model: str
    input: list[InputItemParam]
    stream: bool
    store: bool
    max_output_tokens: int
    instructions: NotRequired[str]
    tools: NotRequired[list[ResponsesToolParam]]
    reasoning: NotRequired[ReasoningParam]
    include: NotRequired[list[str]]
    prompt_cache_key: NotRequired[str]


# --- Responses: the stream -------------------------------------------------------------------

class ResponsesItemEvent(TypedDict, total=False):
    type: str
    id: str
    call_id: str
    name: str
    arguments: str


class InputDetailsEvent(TypedDict, total=False):
    cached_tokens: int | None


class ResponsesUsageEvent(TypedDict, total=False):
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    input_tokens_details: InputDetailsEvent | None


class ResponseEvent(TypedDict, total=False):
    status: str | None
    usage: ResponsesUsageEvent | None
    error: ErrorEvent | None


class ResponsesEvent(TypedDict, total=False):
    """One Responses stream event, all its kinds' fields (``response.output_text.delta``:
    ``item_id`` and ``delta``; ``response.output_item.added``: ``item``; ...)."""

    type: str
    item_id: str
    delta: str
    summary_index: int
    item: ResponsesItemEvent
    response: ResponseEvent | None
    message: str | None
    code: str | None


def responses_event(data: object) -> ResponsesEvent:
    """The reader of the Responses stream: a decoded event as a `ResponsesEvent`."""
    return cast(ResponsesEvent, json_object(data))
