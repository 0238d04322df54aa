"""The GGUF's own tokenizer through llama-server (/apply-template, /tokenize, /detokenize), for a GGUF
that has no Hugging Face tokenizer files beside it. Same interface as engine.tokenizer.ChatTokenizer."""
from __future__ import annotations

from ...errors import EngineError
from ...tokenizer import TemplateError


class ServerTokenizer:
    def __init__(self, pair, meta: dict):
        self.pair = pair
        self.eos_ids = tuple(sorted({int(meta[k]) for k in ("tokenizer.ggml.eos_token_id",
                                                             "tokenizer.ggml.eot_token_id") if k in meta}))
        template = str(meta.get("tokenizer.chat_template") or "")
        self.has_template = bool(template)
        self.supports_thinking = "enable_thinking" in template

    def _post(self, path: str, body: dict) -> dict:
        status, reply = self.pair.tokenizer_server().request("POST", path, body)
        if status == 200:
            return reply
        message = str(reply.get("error", {}).get("message", reply) if isinstance(reply, dict) else reply)
        if path == "/apply-template" and status < 500:
            # the server refused the messages: its message ends with the template's own error
            raise TemplateError.failed(message.strip().splitlines()[-1].removeprefix("Error: "))
        raise EngineError(f"llama-server's {path} failed ({status}): {message}", code="engine_crashed")

    def encode_chat(self, messages: list[dict], raw: bool = False, enable_thinking: bool | None = None,
                    max_tokens: int | None = None, cancelled=lambda: False) -> list[int]:
        if raw or not self.has_template:
            text = "".join(m["content"] for m in messages)
        else:
            extra = {} if enable_thinking is None else {"chat_template_kwargs": {"enable_thinking": enable_thinking}}
            text = self._post("/apply-template", {"messages": messages, **extra})["prompt"]
        return [int(t) for t in self._post("/tokenize", {"content": text, "add_special": False,
                                                          "parse_special": True})["tokens"]]

    def encode_prompt(self, text: str, raw: bool = False, max_tokens: int | None = None) -> list[int]:
        return self.encode_chat([{"role": "user", "content": text}], raw=raw, max_tokens=max_tokens)

    def decode(self, ids: list[int]) -> str:
        return self._post("/detokenize", {"tokens": list(ids)})["content"]
