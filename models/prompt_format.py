"""The prompt format a fine-tuned adapter is trained and asked in (docs/protocols.md, MediTOD), shared by fine-tuning
(finetune/data.py) and MediTOD's supervised run: ``chat`` (the base's chat template) or ``completion``
(the messages joined by newlines, the authors' rendering for a base without a chat template), the reply
after the response marker ``[answer]`` and ending with ``[done]``. Which one applies: the format an
adapter's recipe.yaml records, else the one its base's default recipe (finetune/configs) trains on."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml

PromptFormat = Literal["completion", "chat"]
DEFAULT_FORMAT = "chat"  # a recipe that does not say, a base without a default recipe
ANSWER = "[answer]"
DONE = "[done]"
RECIPE_DIR = Path(__file__).parents[1] / "finetune" / "configs"
# the recipe a base alias gets when `medstack finetune` is not given --config
DEFAULT_RECIPES = {"embedded": "embedded-cpu.yaml", "llama3-8b-instruct": "llama3-8b-nlu.yaml", "openbiollm-8b": "openbiollm-8b-nlu.yaml"}


def default_recipe(base: str) -> Path | None:
    name = DEFAULT_RECIPES.get(base)
    return RECIPE_DIR / name if name else None


def recipe_prompt_format(path: Path) -> str | None:
    """``data.prompt_format`` of a recipe file (None: no such file, unreadable, or not set)."""
    try:
        data = (yaml.safe_load(path.read_text()) or {}).get("data") if path.exists() else None
    except yaml.YAMLError:
        return None
    return data.get("prompt_format") if isinstance(data, dict) else None


def default_prompt_format(alias: str) -> str:
    """The format the base's default fine-tuning recipe trains on (chat where it has none)."""
    recipe = default_recipe(alias)
    return (recipe_prompt_format(recipe) if recipe else None) or DEFAULT_FORMAT


def adapter_prompt_format(path: str) -> str | None:
    """The format an adapter was trained on, from the recipe.yaml `medstack finetune` writes beside it."""
    return recipe_prompt_format(Path(path).parent / "recipe.yaml")


def render_sft(messages: list[dict], prompt_format: str, tokenizer=None) -> str:
    """Training text (messages end with the assistant) or the inference prompt (they end with the user:
    the generation prompt and ``[answer]`` follow). ``chat`` needs the base's tokenizer."""
    generate = messages[-1]["role"] != "assistant"
    if prompt_format == "chat":
        if tokenizer is None:
            raise ValueError("the chat format needs the base model's tokenizer")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=generate, tokenize=False)
        return text + ANSWER if generate else text
    text = "\n".join(m["content"] for m in messages)
    return text + "\n" + ANSWER if generate else text


def strip_bos(text: str, tokenizer) -> str:
    """A rendered chat prompt without its leading BOS text: the server's completion endpoint adds its own."""
    bos = getattr(tokenizer, "bos_token", None)
    return text[len(bos):] if bos and text.startswith(bos) else text
