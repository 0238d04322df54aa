"""Command-line front of the engine: `generate` streams one answer with its stats, `bench` compares
plain decoding with DFlash on a prompt set. Runs without Qt."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .backends import ENGINES, METHODS
from .errors import EngineError
from .limits import LIMITS, GenerationSettings

DRAFT_COLOUR, RESET = "\033[32m", "\033[0m"


AUTO_HELP = ("auto: MLX on Apple Silicon, torch on an NVIDIA GPU, else llama.cpp where it is built, as the app's "
             "first start plans")


def add_pair_args(p: argparse.ArgumentParser, engine: str = "auto", why: str = AUTO_HELP) -> None:
    p.add_argument("--pair", choices=["chat", "demo"],
                   help="a built-in pair: chat (SmolLM2-135M-Instruct and our drafter; the default without --target "
                        "where its model is installed) or demo (the code pair)")
    p.add_argument("--target", type=Path, help="target model folder (config.json, *.safetensors, tokenizer) or GGUF")
    p.add_argument("--draft", type=Path, help="DFlash drafter folder (config.json, *.safetensors)")
    p.add_argument("--engine", choices=["auto", *sorted(ENGINES)], default=engine,
                   help=f"the engine that runs the pair (default {why})")
    p.add_argument("--device", default="auto",
                   help="auto (an NVIDIA GPU, else Apple's GPU, else the CPU), cpu, cuda, cuda:1, mps "
                        "(the mlx engine: auto, cpu, gpu; llama.cpp: auto, cpu, vulkan, cuda, metal)")
    p.add_argument("--raw", action="store_true", help="skip the tokenizer's chat template")
    p.add_argument("--max-new-tokens", type=int, default=LIMITS["max_new_tokens"].default,
                   help=LIMITS["max_new_tokens"].help)
    p.add_argument("--block-size", type=int, help=LIMITS["block_size"].help)
    p.add_argument("--draft-cutoff", type=float, help=LIMITS["draft_cutoff"].help)
    p.add_argument("--no-fallback", action="store_true",
                   help="keep DFlash on even when acceptance stays below the break-even point")
    p.add_argument("--json", type=Path, help="also write the results as JSON to this file")


SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "loop_guard")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-desktop", description="DFlash speculative decoding engine")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate one answer and print its stats")
    add_pair_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--baseline", action="store_true", help="plain decoding, no drafter")
    for name in SAMPLING_FLAGS:
        lim = LIMITS[name]
        g.add_argument("--" + name.replace("_", "-"), type=lim.kind, default=lim.default, help=lim.help)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="colour the tokens the drafter proposed (default: when printing to a terminal)")
    b = sub.add_parser("bench", help="plain decoding vs DFlash on a prompt set")
    add_pair_args(b, engine="torch", why="torch: bench holds DFlash to plain decoding's exact tokens, which "
                                         "llama.cpp's batched verify of quantized weights can miss by rounding")
    b.add_argument("--prompts", type=Path, help="JSON list or text file, one prompt per line "
                                                "(default for the demo pair: held-out stdlib files)")
    b.add_argument("--limit", type=int, help="use only the first N prompts")
    b.add_argument("--peers", action="store_true",
                   help="also time transformers generate() and prompt-lookup decoding on the same target")
    t = sub.add_parser("train-draft", help="train a DFlash drafter for a target on its own answers")
    t.add_argument("--target", type=Path, required=True, help="target model folder (with tokenizer)")
    data = t.add_mutually_exclusive_group(required=True)
    data.add_argument("--corpus", type=Path, help="a text file or a folder of text files: the target continues "
                                                  "passages of them")
    data.add_argument("--chats", type=Path, help="a JSONL file, one conversation per line (a list of "
                                                 '{"role", "content"} messages ending with a user turn): the '
                                                 "target answers each through its chat template")
    t.add_argument("--glob", default="**/*", help="files to take from a corpus folder (default: all)")
    t.add_argument("--out", type=Path, required=True, help="folder for the drafter (must not hold one)")
    t.add_argument("--work-dir", type=Path, help="intermediate data and checkpoints (default OUT/../OUT.work)")
    t.add_argument("--block-size", type=int, default=16)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--sequences", type=int, default=1200, help="responses the target regenerates")
    t.add_argument("--response-length", type=int, default=256, help="tokens per continuation; with --chats, "
                                                                    "the most an answer may take")
    t.add_argument("--minutes", type=float, default=40.0, help="training wall-clock budget")
    t.add_argument("--steps", type=int, help="a fixed number of steps instead of --minutes")
    t.add_argument("--precision", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="matrix products while training (auto: bfloat16 where the CPU has it natively)")
    t.add_argument("--answer-vocab", action="store_true",
                   help="train the softmax over only the tokens the target's answers use (several times fewer "
                        "LM-head rows per step on a CPU; generation still uses the whole head)")
    t.add_argument("--overwrite", action="store_true")
    return parser


def read_corpus(path: Path, pattern: str) -> list[str]:
    files = [path] if path.is_file() else sorted(p for p in path.glob(pattern) if p.is_file())
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def read_chats(path: Path) -> list[list[dict]]:
    """Conversations from a JSONL file, each checked: a list of role/content messages ending with a user turn."""
    from .training.draft_trainer import TrainingError
    chats = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            chat = json.loads(line)
        except ValueError as exc:
            raise TrainingError(f"{path} line {number} is not JSON ({exc}); write one conversation per line.") from None
        if not (isinstance(chat, list) and chat and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                        and m.get("role") in ("system", "user", "assistant")
                                                        for m in chat) and chat[-1]["role"] == "user"):
            raise TrainingError(f"{path} line {number} is not a conversation: give a list of "
                                '{"role": "system"|"user"|"assistant", "content": text} messages ending with a '
                                "user message.")
        chats.append(chat)
    if not chats:
        raise TrainingError(f"{path} holds no conversation.")
    return chats


def cmd_train_draft(args) -> int:
    from .training.draft_trainer import DraftTrainer, DraftTrainSettings, TrainingError
    source = args.corpus or args.chats
    if not source.exists():
        raise TrainingError(f"{'Corpus' if args.corpus else 'Chats file'} {source} does not exist.")
    items = read_chats(args.chats) if args.chats else [d for d in read_corpus(args.corpus, args.glob) if d.strip()]
    held = items[-max(1, len(items) // 20):] if len(items) > 1 else []
    train = items[: len(items) - len(held)] or items
    settings = DraftTrainSettings(block_size=args.block_size, layers=args.layers, sequences=args.sequences,
                                  response_length=args.response_length, minutes=None if args.steps else args.minutes,
                                  steps=args.steps, answer_vocab=args.answer_vocab,
                                  bf16={"auto": None, "float32": False, "bfloat16": True}[args.precision])
    work = args.work_dir or args.out.with_name(args.out.name + ".work")
    trainer = DraftTrainer(args.target, args.out, work, settings, overwrite=args.overwrite,
                           log=lambda line: print(line, file=sys.stderr, flush=True))
    tok = trainer.pair.tokenizer
    if args.chats:
        eval_prompts = [tok.encode_chat(c) for c in held[:3]]
        result = trainer.train(eval_prompts=eval_prompts, chats=train)
    else:
        eval_prompts = [tok.encode_prompt(d[:600], raw=True) for d in held[:3]]
        result = trainer.train(train, eval_prompts)
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=2))
    return 0


def check_args(args) -> None:
    """Refuse bad arguments before any model loads: output folders, text that is not valid UTF-8."""
    if getattr(args, "json", None) is not None and not args.json.parent.is_dir():
        raise EngineError(f"--json {args.json}: the folder {args.json.parent} does not exist. Create it first.")
    for name in ("prompt", "target", "draft", "json", "prompts"):
        value = getattr(args, name, None)
        try:
            str(value).encode("utf-8")
        except UnicodeEncodeError:
            raise EngineError(f"--{name} holds bytes that are not valid UTF-8; pass it as UTF-8 text.") from None


def settings_of(args, **sampling) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                              draft_cutoff=args.draft_cutoff, plain_fallback=not args.no_fallback, **sampling)


def builtin_pair(name: str | None) -> tuple[str, Path, Path]:
    """(name, target, drafter) of a built-in pair: the one named, else the chat pair where its model is
    installed, else the code pair."""
    from . import chat_pair
    from .bench import DEMO_DIR
    if name != "demo":
        try:
            return "chat", chat_pair.gguf_path(), chat_pair.DRAFT_DIR
        except chat_pair.Missing as exc:
            if name == "chat":
                raise EngineError(str(exc)) from None
    if not (DEMO_DIR / "target" / "config.json").is_file():
        raise EngineError(f"The embedded demo pair is missing from {DEMO_DIR}; reinstall the app "
                          "or pass --target and --draft.")
    return "demo", DEMO_DIR / "target", DEMO_DIR / "draft"


def resolve_pair(args):
    """Load the pair the arguments name, on the engine named or (auto) planned here, as serve plans it (with
    llama.cpp's fallback to torch), without serve's comparison."""
    from .backends import choice
    if args.target is None:
        if args.draft is not None:
            raise EngineError("--draft needs --target: name the model the drafter belongs to.")
        name, target, draft = builtin_pair(args.pair)
    elif args.pair:
        raise EngineError("--pair names a built-in pair; leave out --target (or --pair).")
    else:
        name, target, draft = None, args.target, args.draft
    engine, picked = args.engine, args.engine == "auto"
    if picked:
        engine = choice.auto_engine(target, args.device, draft)
    pair, _, note = choice.load_chosen(engine, target, draft, device=args.device, may_fall_back=picked)
    if note:
        print(note, file=sys.stderr)
    if name:
        pair.name = name
    if pair.tokenizer is None:
        raise EngineError(f"The target folder {target} has no tokenizer files; text prompts need tokenizer.json.")
    return pair


def cmd_generate(args) -> int:
    from .loop import Generation
    settings = settings_of(args, **{name: getattr(args, name) for name in SAMPLING_FLAGS},
                           stop_strings=tuple(args.stop))
    pair = resolve_pair(args)
    ids = pair.tokenizer.encode_prompt(args.prompt, raw=args.raw, max_tokens=pair.max_positions)
    run = Generation(pair, ids, settings, baseline=args.baseline)
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    for step in run:
        for text, drafted in step.spans:
            sys.stdout.write(f"{DRAFT_COLOUR}{text}{RESET}" if colour and drafted else text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    s = run.stats
    mode = ("plain decoding" if s.method == "plain"
            else f"{METHODS.get(s.speculation, s.speculation)}, block {run.block_size}")
    where = f"{pair.info['engine']} engine on {pair.info['device']}, {pair.info['dtype']}"
    print(f"\n[{mode}; {where}] {s.generated_tokens} tokens, stop: {run.stop_reason}, "
          f"{s.end_to_end_tok_s:.1f} tok/s end to end, decode {s.decode_tok_s:.1f} tok/s, "
          f"time to first token {s.ttft_s * 1000:.0f} ms, prefill {s.prefill_tok_s:.0f} tok/s", file=sys.stderr)
    if pair.info.get("device_note"):      # not on the GPU asked for, or only partly
        print(pair.info["device_note"], file=sys.stderr)
    if run.fallback:
        print(run.fallback["reason"], file=sys.stderr)
    if run.block_size > 1:
        print(f"acceptance rate {s.acceptance_rate:.1%}, mean acceptance length tau {s.tau:.2f}, "
              f"histogram {s.histogram}", file=sys.stderr)
    print(f"peak memory {s.peak_memory_bytes / 2**20:.0f} MiB", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({
            "prompt": args.prompt, "prompt_ids": ids, "token_ids": run.tokens, "text": run.text,
            "stop_reason": run.stop_reason, "mode": "baseline" if run.block_size == 1 else "dflash",
            "stats": s.to_dict()}, indent=2), encoding="utf-8")
    return 0


def cmd_bench(args) -> int:
    from .bench import chat_prompts, demo_prompts, format_table, load_prompts, run_bench
    settings = settings_of(args)   # refuse bad settings before loading
    pair = resolve_pair(args)
    if pair.block_size == 1:
        raise EngineError("bench compares plain decoding with DFlash: pass --draft too.")
    if args.prompts:
        prompts = load_prompts(args.prompts)
    elif pair.name == "demo":
        prompts = demo_prompts()
    elif pair.name == "chat":
        prompts = chat_prompts()
    else:
        raise EngineError("Pass --prompts FILE (a JSON list or one prompt per line) for this pair.")
    prompts = prompts[: args.limit] if args.limit else prompts
    if not prompts:
        raise EngineError("The prompt set is empty.")
    summary = run_bench(pair, prompts, settings, raw=args.raw or pair.name == "demo", peers=args.peers,
                        progress=lambda line: print(line, file=sys.stderr))
    print(format_table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return 0 if summary["all_identical"] or not summary["exact_expected"] else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        commands = {"generate": cmd_generate, "bench": cmd_bench, "train-draft": cmd_train_draft}
        return commands[args.command](args)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
