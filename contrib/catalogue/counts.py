"""forged's models beside the ancestor's catalogue, per wire API: what ``forged --list-models``
offers with every provider signed in, and what npm ``@earendil-works/pi-ai`` ships.

    python contrib/catalogue/counts.py package/dist/providers/data

Every provider's key variable is set to a dummy value (and AWS keys, Vertex AI's credentials
and ChatGPT and GitHub Copilot sign-ins are given) in a scratch agent folder, then forged's own listing is
counted; nothing is sent anywhere.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FORGED = str(Path(sys.executable).parent / "forged")


def pi_counts(data: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for path in data.glob("*.json"):
        for api, models in json.loads(path.read_text()).items():
            if isinstance(models, dict):
                counts[api] += sum(1 for model in models.values() if isinstance(model, dict)
                                   and model.get("type", "chat") == "chat")
    return counts


def forged_counts() -> collections.Counter[str]:
    code = ("import collections, json\n"
            "from forged._models import ModelRegistry\n"
            "print(json.dumps(collections.Counter(m.api for m in ModelRegistry().available())))\n")
    with tempfile.TemporaryDirectory() as scratch:
        agent = Path(scratch)
        signed_in = {"type": "oauth", "access": "x", "refresh": "x", "expires": 1}
        (agent / "auth.json").write_text(json.dumps(
            {"openai-codex": signed_in, "github-copilot": signed_in}))
        (agent / "adc.json").write_text("{}")
        from forged._models import catalogue_providers

        env = {**os.environ, "AGENT_FORGE_DIR": str(agent),
               "ANTHROPIC_API_KEY": "x", "OPENAI_API_KEY": "x",
               "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
               "GOOGLE_APPLICATION_CREDENTIALS": str(agent / "adc.json"),
               "GOOGLE_CLOUD_PROJECT": "x", "GOOGLE_CLOUD_LOCATION": "x",
               **{key: "x" for key in catalogue_providers().values() if key}}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True)
    return collections.Counter(json.loads(done.stdout))


if __name__ == "__main__":
    theirs, ours = pi_counts(Path(sys.argv[1])), forged_counts()
    print(f"{'api':<36} {'forged':>7} {'pi 1.6.0':>9}")
    for api in sorted(theirs.keys() | ours.keys(), key=lambda api: -theirs[api]):
        if ours[api] or theirs[api]:
            print(f"{api:<36} {ours[api]:>7} {theirs[api]:>9}")
    print(f"{'all':<36} {sum(ours.values()):>7} {sum(theirs.values()):>9}")
