"""Rank the shipped pairs' tokens by how often their targets use them: the draft vocabulary each drafter proposes
from (engine/draft_vocab.py), written beside the drafter as draft_vocab.json.

    python scripts/build_draft_vocab.py demo            # the code pair: its target's training files
    python scripts/build_draft_vocab.py chat --chats 400   # the chat pair: SmolLM2's own answers (about 5 min)

Counted only on training material (the demo pair's training files of Python's standard library; SmolLM2's greedy
answers to the first training conversations of scripts/chat_prompts.py), never on what the benchmarks measure.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import draft_vocab  # noqa: E402


def demo() -> tuple[draft_vocab.DraftVocab, int]:
    import json

    from engine.tokenizer import ChatTokenizer
    from scripts.demo_pair.corpus import build_corpus, read_source
    target = ROOT / "assets" / "demo" / "target"
    tok = ChatTokenizer.from_folder(target)
    vocab_size = json.loads((target / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    corpus = build_corpus()
    texts = (read_source(corpus.root / rel) for rel in corpus.train_files)
    return draft_vocab.rank((tok.encode_prompt(t, raw=True) for t in texts), vocab_size, tok.eos_ids,
                            f"the demo target's {len(corpus.train_files)} training files (Python "
                            f"{sys.version.split()[0]} standard library)")


def chat(chats: int) -> tuple[draft_vocab.DraftVocab, int]:
    import torch

    from engine import chat_pair
    from engine.backends.torch.engine import load_pair
    from engine.training.draft_trainer import regenerate_chats
    from scripts import chat_prompts
    torch.set_num_threads(2)
    pair = load_pair(chat_pair.hf_folder(), None, "cpu", "float32")
    train, _ = chat_prompts.conversations()
    prompts = [pair.tokenizer.encode_chat(c) for c in train[:chats]]
    answered = regenerate_chats(pair, prompts, 192, batch=64, log=lambda line: print(line, file=sys.stderr))
    answers = (seq[start:] for start, seq in answered)
    return draft_vocab.rank(answers, pair.target.vocab_rows, sorted(pair.eos_ids),
                            f"SmolLM2-135M-Instruct's greedy answers to the first {chats} training conversations "
                            "of scripts/chat_prompts.py (up to 192 tokens each)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pair", choices=("demo", "chat"))
    p.add_argument("--chats", type=int, default=400, help="chat pair: how many training conversations to answer")
    args = p.parse_args(argv)
    started = time.time()
    vocab, counted = demo() if args.pair == "demo" else chat(args.chats)
    path = vocab.save(ROOT / "assets" / args.pair / "draft", counted)
    print(f"{path}: {len(vocab.ranked)} of {vocab.vocab_size} tokens ranked from {counted} "
          f"({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
