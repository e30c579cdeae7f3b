"""Commands that do one thing and exit, as the ancestor's: ``--list-models [SEARCH]`` and
``--export FILE [OUT]``."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import trio

from ._config import Options, use_key
from ._context import stored_name
from ._errors import ForgedError
from ._log import log
from ._models import ModelRegistry
from ._paths import agent_dir
from ._store import SessionFile
from ._switching import export_html


def list_models(options: Options, search: str) -> int:
    """The models forged has a key for, those matching `search` (every word of it, letters
    in order, in ``provider id``), as a table: provider, model, context, max-out, thinking,
    images."""
    registry = ModelRegistry()
    registry.load_models_json(agent_dir() / "models.json")
    if registry.error:
        log(f"ignoring custom models: {registry.error}")
    if options.api_key is not None:
        use_key(registry, options, options.provider)
    models = registry.available()
    if not models:
        print(registry.no_model_reason())
        return 0
    found = [model for model in models if _fuzzy(search, f"{model.provider} {model.id}")]
    if not found:
        print(f'No models matching "{search}"')
        return 0
    found.sort(key=lambda model: (model.provider, model.id))
    rows = [("provider", "model", "context", "max-out", "thinking", "images")]
    rows += [(model.provider, model.id, _tokens(model.context_window), _tokens(model.max_tokens),
              "yes" if model.reasoning else "no", "yes" if "image" in model.input else "no")
             for model in found]
    widths = [max(len(row[column]) for row in rows) for column in range(6)]
    table = "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                    + "\n" for row in rows)
    with contextlib.suppress(BrokenPipeError):  # `| head` read what it wanted
        sys.stdout.write(table)
        sys.stdout.flush()
    return 0


def _fuzzy(search: str, text: str) -> bool:
    text = text.lower()
    for word in search.lower().split():
        position = 0
        for letter in word:
            position = text.find(letter, position) + 1
            if position == 0:
                return False
    return True


def _tokens(count: int) -> str:
    """200000 -> 200K, 1000000 -> 1M, 1500000 -> 1.5M."""
    for size, suffix in ((1_000_000, "M"), (1_000, "K")):
        if count >= size:
            value = count / size
            return f"{value:g}{suffix}" if value == int(value) else f"{value:.1f}{suffix}"
    return str(count)


def export(path: str, output: str | None) -> int:
    """Write the session file at `path` as an HTML page (to `output`, else
    ``forged-session-<name>.html`` in the current directory); print where."""
    cwd = Path.cwd()
    try:
        store = SessionFile.open(Path(path).expanduser(), cwd)
        try:
            written = trio.run(lambda: export_html(store, cwd, output, name=stored_name(store),
                                                   model=None))
        finally:
            store.close()
    except (ForgedError, OSError) as exc:
        log(str(exc))
        return 1
    print(f"Exported to: {written}")
    return 0
