"""Make forged's model catalogue (``forged/catalogue/``) from the public data the ancestor
ships: npm ``@earendil-works/pi-ai``, ``dist/providers/data/*.json``.

    npm pack @earendil-works/pi-ai && tar xzf earendil-works-pi-ai-*.tgz
    python contrib/catalogue/generate.py package/dist/providers/data forged/catalogue

It writes ``providers.json`` (each provider's key variable; read at start-up) and one
``<provider>.json`` of models per provider (read when the provider is first needed).

Kept: the chat models of the providers forged can reach with a key from the environment, over
an API it speaks (``anthropic-messages``, ``openai-completions``, ``openai-responses``,
``google-generative-ai``, ``google-vertex``, ``azure-openai-responses``,
``mistral-conversations``, ``openai-codex-responses``, ``bedrock-converse-stream``). Azure's
models have no address of their own (the resource's comes from the environment); Codex's and
GitHub Copilot's sign in only, Bedrock's with AWS's credentials (their key variable is empty).
Left out: ``anthropic`` and ``openai`` (forged's own definitions of them stay), providers whose
address needs an account's ids or that sign in with flows forged lacks (Cloudflare, Radius),
and what forged does not use of a model (input limits, cache lifetimes, price tiers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

APIS = ("anthropic-messages", "openai-completions", "openai-responses", "google-generative-ai",
        "google-vertex", "azure-openai-responses", "mistral-conversations",
        "openai-codex-responses", "bedrock-converse-stream")
NO_ADDRESS = ("azure-openai-responses",)
"""APIs whose models are kept without a ``baseUrl``: forged finds it in the environment."""

KEYS: dict[str, str] = {
    "amazon-bedrock": "", "ant-ling": "ANT_LING_API_KEY", "azure": "AZURE_OPENAI_API_KEY",
    "baseten": "BASETEN_API_KEY",
    "cerebras": "CEREBRAS_API_KEY", "deepseek": "DEEPSEEK_API_KEY",
    "fireworks": "FIREWORKS_API_KEY", "github-copilot": "", "google": "GEMINI_API_KEY",
    "google-vertex": "GOOGLE_CLOUD_API_KEY", "groq": "GROQ_API_KEY",
    "huggingface": "HF_TOKEN",
    "kimi-coding": "KIMI_API_KEY", "meta": "META_API_KEY", "minimax": "MINIMAX_API_KEY",
    "minimax-cn": "MINIMAX_CN_API_KEY", "mistral": "MISTRAL_API_KEY",
    "moonshotai": "MOONSHOT_API_KEY",
    "moonshotai-cn": "MOONSHOT_API_KEY", "nvidia": "NVIDIA_API_KEY",
    "openai-codex": "", "opencode": "OPENCODE_API_KEY", "opencode-go": "OPENCODE_API_KEY",
    "openrouter": "OPENROUTER_API_KEY", "qwen-token-plan": "QWEN_TOKEN_PLAN_API_KEY",
    "qwen-token-plan-cn": "QWEN_TOKEN_PLAN_CN_API_KEY",
    "qwen-token-plan-individual": "QWEN_TOKEN_PLAN_INDIVIDUAL_API_KEY",
    "qwen-token-plan-individual-cn": "QWEN_TOKEN_PLAN_INDIVIDUAL_CN_API_KEY",
    "together": "TOGETHER_API_KEY", "vercel-ai-gateway": "AI_GATEWAY_API_KEY",
    "xai": "XAI_API_KEY", "xiaomi": "XIAOMI_API_KEY",
    "xiaomi-token-plan-ams": "XIAOMI_TOKEN_PLAN_AMS_API_KEY",
    "xiaomi-token-plan-cn": "XIAOMI_TOKEN_PLAN_CN_API_KEY",
    "xiaomi-token-plan-sgp": "XIAOMI_TOKEN_PLAN_SGP_API_KEY",
    "zai": "ZAI_API_KEY", "zai-coding-cn": "ZAI_CODING_CN_API_KEY",
}
"""Each kept provider's key variable, as the ancestor reads it (``env-api-keys``); empty for
one that only signs in (auth.json)."""

FIELDS = ("id", "name", "api", "baseUrl", "reasoning", "input", "contextWindow", "maxTokens",
          "thinkingLevelMap", "compat", "headers")


def model(raw: dict[str, Any]) -> dict[str, Any]:
    kept = {key: raw[key] for key in FIELDS if raw.get(key) is not None}
    cost = raw.get("cost") or {}
    kept["cost"] = {key: cost.get(key, 0) for key in ("input", "output", "cacheRead",
                                                      "cacheWrite")}
    return kept


def write_catalogue(data: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    providers: dict[str, str] = {}
    for name, key in sorted(KEYS.items()):
        source = data / f"{name}.json"
        if not source.exists():
            continue
        by_api = json.loads(source.read_text())
        models = [model(raw) for api in APIS for raw in by_api.get(api, {}).values()
                  if raw.get("type", "chat") == "chat"
                  and (raw.get("baseUrl") or api in NO_ADDRESS)]
        if models:
            models.sort(key=lambda m: m["id"])
            providers[name] = key
            (out / f"{name}.json").write_text(json.dumps(models, separators=(",", ":")) + "\n")
    (out / "providers.json").write_text(json.dumps(
        {"source": "@earendil-works/pi-ai 1.6.0, dist/providers/data", "providers": providers},
        indent=1) + "\n")


if __name__ == "__main__":
    write_catalogue(Path(sys.argv[1]), Path(sys.argv[2]))
