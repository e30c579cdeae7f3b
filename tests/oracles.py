"""The official SDKs as oracles: what forged sends is what the real services accept, and what
the scripted server streams is what they send.

forged never imports the SDKs (they cost seconds of start-up); the tests do. Every request
the harness's scripted servers record is checked with `check_request`: its body validates
against the SDK's own parameter type for a streaming request of its API, and validating it
drops or changes nothing, so no field is unknown to the SDK; its headers carry the API's auth.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

import botocore.session
import botocore.validate
import orjson
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from google.genai import types as genai
from mistralai.client.models import ChatCompletionStreamRequest as MistralRequest
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsStreaming
from pydantic import BaseModel, ConfigDict, TypeAdapter
from pydantic.alias_generators import to_camel

from forged._providers.formats import format_of
from forged._providers.scripted import RecordedRequest

PARAMS: dict[str, Any] = {
    "anthropic": MessageCreateParamsStreaming,
    "chat": CompletionCreateParamsStreaming,
    "responses": ResponseCreateParamsStreaming,
    "mistral": MistralRequest,
}
"""Each streaming format's parameter type (`forged._providers.scripted.format_of`)."""


class GeminiRequest(BaseModel):
    """The REST body of Gemini's ``generateContent`` (the Gemini API's and Vertex AI's),
    made of the SDK's own types, which forbid unknown fields."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)
    contents: list[genai.Content]
    system_instruction: genai.Content | None = None
    tools: list[genai.Tool] | None = None
    tool_config: genai.ToolConfig | None = None
    generation_config: genai.GenerationConfig | None = None
    safety_settings: list[genai.SafetySetting] | None = None
    cached_content: str | None = None


@functools.cache
def adapter(path: str) -> TypeAdapter[Any]:
    return TypeAdapter(PARAMS[path])


def same_bytes(sent: Any, validated: Any) -> bool:
    """Whether two strings are one base64 value (the SDK writes bytes back URL-safe)."""
    if not (isinstance(sent, str) and isinstance(validated, str)):
        return False
    try:
        return base64.b64decode(sent, validate=True) == base64.urlsafe_b64decode(validated)
    except (binascii.Error, ValueError):
        return False


def materialized(value: Any) -> Any:
    """`value` as plain JSON data. pydantic validates the SDK's ``Iterable[...]`` fields
    lazily, as iterators: consuming them here is what validates their items."""
    if isinstance(value, BaseModel):
        return materialized(value.model_dump(mode="json", by_alias=True, exclude_unset=True))
    if isinstance(value, dict):
        return {key: materialized(item) for key, item in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [materialized(item) for item in value]
    return value


def differences(sent: Any, validated: Any, path: str = "body") -> Iterable[str]:
    """Where the validated body differs from the one sent: a field the SDK does not know was
    dropped, or a value was coerced."""
    if isinstance(sent, dict) and isinstance(validated, dict):
        for key in sent.keys() | validated.keys():
            if key not in validated:
                yield f"{path}.{key}: not a field of the SDK's type"
            elif key not in sent:
                yield f"{path}.{key}: added by validation"
            else:
                yield from differences(sent[key], validated[key], f"{path}.{key}")
    elif isinstance(sent, list) and isinstance(validated, list) and len(sent) == len(validated):
        for index, (a, b) in enumerate(zip(sent, validated, strict=True)):
            yield from differences(a, b, f"{path}[{index}]")
    elif (sent != validated or type(sent) is not type(validated)) and not same_bytes(
            sent, validated):
        yield f"{path}: sent {sent!r}, validated as {validated!r}"


def check_gemini_request(request: RecordedRequest) -> None:
    assert request.headers.get("x-goog-api-key") or request.headers.get("authorization")
    validated = GeminiRequest.model_validate_json(orjson.dumps(request.body))
    found = list(differences(request.body, materialized(validated)))
    assert not found, f"{request.path}: {found}"


@functools.cache
def converse_stream() -> Any:
    """botocore's service model of Bedrock's ConverseStream: its input shape."""
    return botocore.session.get_session().get_service_model(
        "bedrock-runtime").operation_model("ConverseStream").input_shape


def check_bedrock_request(request: RecordedRequest) -> None:
    """The body, with the model id from the path, is what botocore's own validator accepts
    for ConverseStream (it refuses unknown fields); the request is signed or carries a key."""
    authorization = request.headers["authorization"]
    assert authorization.startswith(("Bearer ", "AWS4-HMAC-SHA256 "))
    model = unquote(request.path.removesuffix("/converse-stream").rsplit("/", 1)[-1])
    botocore.validate.validate_parameters({**request.body, "modelId": model},
                                          converse_stream())


def check_request(request: RecordedRequest) -> None:
    kind = format_of(request.path)
    assert kind is not None, f"no wire API at {request.path}"
    assert request.method == "POST"
    assert request.headers["content-type"] == "application/json"
    if kind == "gemini":
        check_gemini_request(request)
        return
    if kind == "bedrock":
        check_bedrock_request(request)
        return
    if kind == "anthropic":
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert request.headers.get("x-api-key") or request.headers.get("authorization")
    elif request.path.startswith("/openai/"):  # Azure's
        assert request.headers["api-key"] and "authorization" not in request.headers
    else:
        assert request.headers["authorization"].startswith("Bearer ")
    validated = materialized(adapter(kind).validate_python(request.body))
    found = list(differences(request.body, validated))
    assert not found, f"{request.path}: {found}"


def check_requests(requests: Iterable[RecordedRequest]) -> None:
    for request in requests:
        check_request(request)
