"""A frequency-ranked draft vocabulary (FR-Spec): the drafter proposes only the K tokens its target says most
often, computing draft logits with those K rows of the LM head alone. The head is most of a small drafter's
work (SmolLM2's is 49,152 rows of 576), so this makes the draft pass cheaper. Output never changes: the verify
still scores the whole vocabulary, a token outside the subset is simply never drafted, and under sampling the
proposal is the subset's renormalised distribution, which the residual rule accepts exactly.

The ranking ships beside a drafter as `draft_vocab.json` (scripts/build_draft_vocab.py counts tokens in training
material: the target's own answers, or its training text); a drafter without one drafts over every token. A
drafter trained to propose a subset (a speculators drafter's `d2t`, engine/speculators.py) ships that subset,
`trained`: it drafts from all of it by default, on every device, as it was trained to."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

FILE = "draft_vocab.json"
FORMAT = 1
# Every engine's default on a CPU: the 8k most frequent tokens (a ranked drafter of ours then drafts from its
# whole ranking). Measured in torch, llama.cpp and MLX: docs/BENCHMARKS.md, "Draft vocabulary". On a GPU the
# default is every token: not measured there.
CPU_SIZE = 8192


def default_size(on_cpu: bool) -> int:
    return CPU_SIZE if on_cpu else 0


@dataclass(frozen=True)
class DraftVocab:
    """Token ids, most frequent first, of a vocabulary of `vocab_size`; what they were counted on."""
    ranked: tuple[int, ...]
    vocab_size: int
    corpus: str = ""
    trained: bool = False     # the drafter was trained on these tokens alone (in id order, not ranked)

    def chosen(self, setting: int | None, on_cpu: bool) -> tuple[int, ...] | None:
        """The ids an answer drafts from: the setting's count (0: every token), or by default the drafter's
        trained set, else the measured default for the device (None: every token)."""
        if setting is None:
            setting = len(self.ranked) if self.trained else default_size(on_cpu)
        return self.top(setting)

    def top(self, k: int | None) -> tuple[int, ...] | None:
        """The k most frequent ids (all that were ranked, for a k past them); None, the whole vocabulary, for k
        0/None or when they are every token."""
        ids = self.ranked[:k] if k else ()
        return ids if 0 < len(ids) < self.vocab_size else None

    def save(self, folder: Path, counted: int) -> Path:
        path = Path(folder) / FILE
        path.write_text(json.dumps({"format": FORMAT, "vocab_size": self.vocab_size, "corpus": self.corpus,
                                    "tokens_counted": counted, "trained": self.trained,
                                    "ranked": list(self.ranked)}) + "\n",
                        encoding="utf-8")
        return path


def rank(sequences: Iterable[Iterable[int]], vocab_size: int, first: Iterable[int] = (),
         corpus: str = "") -> tuple[DraftVocab, int]:
    """Every id the sequences hold, most frequent first (ties by id, so the ranking is deterministic); the ids
    in `first` (end-of-turn tokens: every answer ends with one) lead. Returns the vocabulary and the count."""
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(seq)
    lead = list(dict.fromkeys(first))
    ranked = lead + sorted((t for t in counts if t not in lead), key=lambda t: (-counts[t], t))
    vocab = DraftVocab(tuple(ranked), vocab_size, corpus)
    check(vocab, "the ranking")
    return vocab, sum(counts.values())


def load(draft_dir: Path, vocab_size: int) -> DraftVocab | None:
    """The drafter folder's ranking, checked against its target's vocabulary; None where it has none."""
    path = Path(draft_dir) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        vocab = DraftVocab(tuple(data["ranked"]), int(data["vocab_size"]), str(data.get("corpus", "")),
                           data.get("trained") is True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} cannot be read as a draft vocabulary ({exc}). Delete the file to draft "
                              "over the whole vocabulary, or rebuild it (scripts/build_draft_vocab.py).") from None
    if vocab.vocab_size != vocab_size:
        raise CheckpointError(f"{path} ranks a vocabulary of {vocab.vocab_size} tokens but the target has "
                              f"{vocab_size}: it belongs to another model. Delete it or rebuild it.")
    check(vocab, str(path))
    return vocab


def for_generation(vocab: DraftVocab | None, generation: int) -> DraftVocab | None:
    """The ranking a drafter of this generation (engine/config.py) drafts from: a DFlash drafter any ranking beside
    it; DFlash2's candidate selector and DSpark's Markov head score every token, so a DSpark drafter only the
    subset it was trained on (a speculators import's) and a DFlash2 drafter none; an EAGLE-3 drafter's head is its
    own subset already (d2t)."""
    takes = {1: True, 2: False, 3: vocab is not None and vocab.trained, 4: False}
    return vocab if takes[generation] else None


def check(vocab: DraftVocab, where: str) -> None:
    ids = vocab.ranked
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab.vocab_size for t in ids):
        raise CheckpointError(f"{where} holds token ids outside 0..{vocab.vocab_size - 1}. Rebuild it.")
    if len(set(ids)) != len(ids):
        raise CheckpointError(f"{where} names a token twice. Rebuild it.")
