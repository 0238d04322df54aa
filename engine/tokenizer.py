"""A target's tokenizer as the decode loop and the worker need it: prompts through the chat template,
ids back to text, the end-of-sequence ids. Shared by the engines that use Hugging Face tokenizers.

A chat template is code from the model folder (Jinja, sandboxed by transformers): it renders under a
deadline that also honours cancel, so a template that loops for ever cannot leave the worker busy.
Remote code is never enabled, and only JSON files are read besides the tokenizer itself.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .errors import CheckpointError, EngineError, PromptTooLongError

TEMPLATE_SECONDS = 5.0
# Classes that are their tokenizer.json as it stands: AutoTokenizer would build exactly this from the file.
AS_SERIALIZED = ("PreTrainedTokenizerFast", "TokenizersBackend")


class TemplateError(EngineError):
    code = "template_error"

    @classmethod
    def failed(cls, reason) -> "TemplateError":
        """A template that raised or could not render these messages (every engine says it alike)."""
        return cls(f"The model's chat template failed: {reason}. Check the messages (roles, order) "
                   "or send the prompt raw.")


class _Stop(BaseException):
    """Raised inside a template's frames; a BaseException so the template's own handlers cannot swallow it."""


@contextmanager
def _deadline(seconds: float, cancelled: Callable[[], bool]) -> Iterator[None]:
    """Run the body with a trace function that stops it once `seconds` pass or `cancelled()` turns true.
    Only this thread is traced, and only while a template renders."""
    end = time.monotonic() + seconds
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += 1
        if count % 512 == 0 and (time.monotonic() > end or cancelled()):
            raise _Stop
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)


class ChatTokenizer:
    def __init__(self, tokenizer, eos_ids: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        template = str(getattr(tokenizer, "chat_template", None) or "")
        self.has_template = bool(template)
        # templates that read enable_thinking (Qwen3 and later) can switch thinking off
        self.supports_thinking = "enable_thinking" in template
        # No token stands for more characters than its own spelling, so a text of n characters needs at
        # least n / longest tokens: a cheap bound that refuses huge prompts before tokenising them.
        self.longest_token = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1

    @classmethod
    def from_folder(cls, path: Path, as_serialized: bool = False) -> "ChatTokenizer | None":
        """The folder's tokenizer, or None where it has none. as_serialized: read tokenizer.json as it stands
        whatever class the folder names (llama.cpp runs the GGUF's own vocabulary, not transformers' rebuild of a
        named class), which keeps PyTorch out of the worker."""
        path = Path(path)
        if not ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()):
            return None
        serialized = (path / "tokenizer.json").is_file() and (as_serialized or _named_class(path) in AS_SERIALIZED)
        try:
            if serialized:
                # transformers' tokenizer module alone: AutoTokenizer's import loads model code, and PyTorch
                from transformers import PreTrainedTokenizerFast
                tok = PreTrainedTokenizerFast.from_pretrained(str(path), trust_remote_code=False)
            else:
                from transformers import AutoTokenizer
                tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        except Exception as exc:  # tokenizers raise many types for damaged files
            if "trust_remote_code" in str(exc):
                raise CheckpointError(f"The tokenizer in {path} can only be loaded by running code from the "
                                      "model folder (its tokenizer_config.json names its own class), and the app "
                                      "never does that. Use a model whose tokenizer transformers knows.") from None
            raise CheckpointError(f"The tokenizer in {path} could not be loaded ({type(exc).__name__}: {exc}). "
                                  "Re-download the model.") from exc
        return cls(tok, eos_ids_of(path, tok))

    def encode_chat(self, messages: list[dict], raw: bool = False, enable_thinking: bool | None = None,
                    max_tokens: int | None = None, cancelled: Callable[[], bool] = lambda: False) -> list[int]:
        """Token ids for a conversation, through the chat template unless raw or there is none."""
        if raw or not self.has_template:
            text = "".join(m["content"] for m in messages)
        else:
            text = self.render(messages, enable_thinking, cancelled)
        if max_tokens is not None and len(text) > max_tokens * self.longest_token:
            raise PromptTooLongError(
                f"The prompt has {len(text):,} characters, far more than the model's context of {max_tokens:,} "
                "tokens can hold. Shorten the prompt or start a new conversation.")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str, raw: bool = False, max_tokens: int | None = None) -> list[int]:
        """A text prompt as one user message."""
        return self.encode_chat([{"role": "user", "content": text}], raw=raw, max_tokens=max_tokens)

    def render(self, messages: list[dict], enable_thinking: bool | None = None,
               cancelled: Callable[[], bool] = lambda: False) -> str:
        kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        try:
            with _deadline(TEMPLATE_SECONDS, cancelled):
                return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                          **kwargs)
        except _Stop:
            what = "was cancelled" if cancelled() else f"took longer than {TEMPLATE_SECONDS:g} s"
            raise TemplateError(f"The model's chat template {what} and was stopped. The template in "
                                "tokenizer_config.json may be broken; send the prompt raw or fix the template.") from None
        except Exception as exc:  # jinja errors, template exceptions raised on purpose (raise_exception)
            raise TemplateError.failed(exc) from exc

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _named_class(path: Path) -> str | None:
    """The tokenizer class tokenizer_config.json names (read as plain JSON), or None."""
    try:
        name = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def eos_ids_of(path: Path, tokenizer) -> tuple[int, ...]:
    """End-of-sequence ids from generation_config.json (read as plain JSON) and the tokenizer."""
    ids: set[int] = set()
    try:
        eos = json.loads((Path(path) / "generation_config.json").read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        eos = None
    for value in eos if isinstance(eos, list) else [eos]:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            ids.add(value)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))
