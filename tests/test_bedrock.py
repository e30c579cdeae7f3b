"""Bedrock beyond the oracle tests: requests signed with SigV4 from AWS's credential chain
(keys in the environment, a profile in the shared files) for the right region, a Bedrock
key as a bearer token, and a throttled stream."""

from __future__ import annotations

from pathlib import Path

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import orjson
import pytest

from forged._catalogue import catalogue_providers
from forged._models import ModelRegistry
from forged._providers.scripted import RecordedRequest, Reply, ScriptText

from .harness import open_client

AWS_VARIABLES = ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_BEDROCK_SKIP_AUTH")
MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"


@pytest.fixture(autouse=True)
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in (*AWS_VARIABLES, *catalogue_providers().values()):
        if key:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask for


def signature_checks(request: RecordedRequest, base_url: str, key: str, secret: str,
                     region: str) -> None:
    """botocore, signing the request as recorded, finds the signature forged sent: the
    body and the signed headers went out as they were signed."""
    sent = request.headers["authorization"]
    assert sent.startswith(f"AWS4-HMAC-SHA256 Credential={key}/")
    assert f"/{region}/bedrock/aws4_request" in sent
    signed = sent.split("SignedHeaders=")[1].split(",")[0].split(";")
    again = botocore.awsrequest.AWSRequest(
        method="POST", url=base_url + request.path, data=orjson.dumps(request.body),
        headers={name: request.headers[name] for name in signed})
    again.context["timestamp"] = request.headers["x-amz-date"]
    auth = botocore.auth.SigV4Auth(botocore.credentials.Credentials(key, secret), "bedrock",
                                   region)
    canonical = auth.canonical_request(again)
    string_to_sign = auth.string_to_sign(again, canonical)
    assert sent.endswith(f"Signature={auth.signature(string_to_sign, again)}")


async def test_keys_in_the_environment_sign_for_its_region(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert ModelRegistry().api_key("amazon-bedrock") == "<authenticated>"
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        await client.use_redirected("amazon-bedrock", MODEL)
        await client.prompt_and_settle("hello")
    (request,) = client.server.requests
    assert request.path == f"/model/{MODEL.replace(':', '%3A')}/converse-stream"
    signature_checks(request, client.server.base_url, "AKIDENV", "env-secret", "eu-west-1")
    assert client.events("message_end")[-1]["message"]["content"] == [
        {"type": "text", "text": "hi"}]


async def test_a_profile_in_the_shared_files_signs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    aws = tmp_path / "home" / ".aws"
    aws.mkdir(parents=True)
    (aws / "credentials").write_text(
        "[dev]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = profile-secret\n")
    (aws / "config").write_text("[profile dev]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_PROFILE", "dev")
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        await client.use_redirected("amazon-bedrock", MODEL)
        await client.prompt_and_settle("hello")
    (request,) = client.server.requests
    signature_checks(request, client.server.base_url, "AKIDPROFILE", "profile-secret",
                     "ap-south-1")


async def test_a_bedrock_key_is_a_bearer_token_and_throttling_is_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "bedrock-key")
    throttled = Reply(status=429, error_type="ThrottlingException",
                      error_message="Too many requests, please wait before trying again.")
    async with open_client(tmp_path, [throttled, Reply(content=[ScriptText(text="ok")])]
                           ) as client:
        await client.use_redirected("amazon-bedrock", MODEL)
        await client.request({"type": "prompt", "message": "hello"})
        started = await client.wait_for(lambda e: e.get("type") == "auto_retry_start")
        await client.request({"type": "abort_retry"})
        await client.settled()
    assert client.server.requests[0].headers["authorization"] == "Bearer bedrock-key"
    assert started["errorMessage"] == (
        "429 Too many requests, please wait before trying again.")


def test_without_credentials_bedrock_says_what_to_set() -> None:
    registry = ModelRegistry()
    assert not registry.has_auth("amazon-bedrock")
    assert registry.key_problem("amazon-bedrock") == (
        "No AWS credentials for amazon-bedrock: set AWS_PROFILE, AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or AWS_BEARER_TOKEN_BEDROCK")
