"""Runs llama.cpp's convert_hf_to_gguf.py (argv[1]) with its own gguf-py, and with transformers told never
to run a model folder's code: the converter asks for trust_remote_code=True in places, and this app
never grants it (SECURITY.md)."""
import runpy
import sys
from pathlib import Path


def main() -> None:
    converter = Path(sys.argv[1]).resolve()
    sys.path[:0] = [str(converter.parent), str(converter.parent / "gguf-py")]
    import transformers
    for name in ("AutoTokenizer", "AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoProcessor"):
        cls = getattr(transformers, name)
        original = cls.from_pretrained.__func__

        def guarded(klass, *args, _original=original, **kwargs):
            kwargs["trust_remote_code"] = False
            return _original(klass, *args, **kwargs)
        cls.from_pretrained = classmethod(guarded)
    sys.argv = [str(converter), *sys.argv[2:]]
    runpy.run_path(str(converter), run_name="__main__")


if __name__ == "__main__":
    main()
