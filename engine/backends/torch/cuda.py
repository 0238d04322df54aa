"""The torch engine's CUDA path: static caches, fixed-shape steps, CUDA graphs, device verification.

- The target's keys and values live in one preallocated buffer per layer (`StaticKV`), sized for the
  context plus one block. A step writes at explicit positions held in a device tensor; a rollback only
  moves that position (stale rows lie past every later query and the mask hides them). Dense Qwen3 and
  Llama targets run through DenseDecoder (dense_decoder.py: packed weights, the attention kernel, on
  CUDA torch.compile), the others through transformers' layers over the same StaticKV.
- The drafter (`StaticDraft`, `StaticDraft2`) keeps DraftRunner's packed layers and buffers, sized once;
  context rows and the block are written at explicit positions, padded context rows go to a spare row
  that no query sees, and its attention is the Triton kernel (kernels.cached_attention) on CUDA.
- A verify runs the full block width (drafts padded) and a draft pass the full block, and the target
  attends over the cache rows up to the next multiple of BUCKET_ROWS past the step (not the whole buffer:
  its cost follows the context, not the setting), so each (width, rows) is one shape, captured once as a
  CUDA graph (`Graphed`) and replayed; prefill, the first draft over the
  prompt's features and shorter blocks at the end of the context run the same code without a graph.
- Verification runs on the device (kernels.verify_greedy / verify_sampled); greedy drafts stay on the
  device (`PendingDrafts`) until verify reads [n, token, drafts] in one transfer: one read per step.

Only dense STATIC_ARCHITECTURES take this path, Qwen3.5 / Qwen3.6 hybrids among them (their DeltaNet
layers keep fixed state buffers and roll back on the device: cuda_hybrid.py); the others (MoE, sliding
windows) run the eager engine (eager.py) on CUDA. On a CPU the same step code runs without graphs or kernels
(tests/test_engine_cuda_path.py checks its greedy tokens against TorchPair); graphs, the kernels in
bfloat16 and speed need a GPU and have not been run or measured in this project's CI."""
from __future__ import annotations

import torch

from ...limits import DEFAULT_CONTEXT, GenerationSettings
from .draft2_runner import Draft2Runner
from .dspark import DSparkRunner
from .draft_runner import DraftRunner, _rms, block_attention
from .dense_decoder import DenseDecoder, fits
from .drafter import rope
from .answer import block_embeddings, draft_over, hold, memory
from .eager import runner_dtype
from .cuda_hybrid import StaticHybridKV
from ...lookup import NGRAM_BLOCK
from .sampling import Candidates, draw, probabilities, propose, verify
from .static_kv import StaticKV

STATIC_ARCHITECTURES = ("qwen3", "llama", "qwen3_5")
PREFILL_CHUNK = 512          # prompt tokens per prefill forward (bounds the mask's size)
BUCKET_ROWS = 1024           # a step attends over the cache rows up to the next multiple of this: one graph each


def supported(family: str) -> bool:
    return family in STATIC_ARCHITECTURES


def static_mask(end: torch.Tensor, n: int, size: int, window: int | None, causal: bool) -> torch.Tensor:
    """block_mask over a whole buffer of `size` positions, with `end` (device) and stale rows >= end hidden."""
    key = torch.arange(size, device=end.device)
    query = (end - n + torch.arange(n, device=end.device)).unsqueeze(1)
    visible = (key < end).expand(n, size)
    if causal:
        visible = visible & (key <= query)
    if window is not None:
        visible = visible & (query - key < window) & (key - query < window)
    return visible


class StaticTarget:
    """The target over a StaticKV: run(ids) at the positions start.. returns (logits [n, V], features)."""

    def __init__(self, target, size: int, kernels=None, dense: bool = True, compiled: bool = False):
        self.target, self.size = target, size
        self.dense = DenseDecoder(target, size, kernels, compiled) if dense and fits(target) else None
        if target.deltanet is None:
            self.cache, self.deltanet = StaticKV(size, target.device), None
        else:
            self.cache = StaticHybridKV(size, target.device)
            self.deltanet = self.cache.deltanet
        self.dtype = target.embedding.weight.dtype

    def rows(self, end: int, bucket: int) -> int:
        """The cache rows a step ending at position `end` attends over: a multiple of bucket, at most all."""
        return min(self.size, -(-end // bucket) * bucket)

    def run(self, ids: torch.Tensor, features: bool, verifying: bool = False, rows: int | None = None,
            last_only: bool = False):
        """verifying: DeltaNet layers keep the block's tape instead of advancing (commit() decides). rows:
        the cache rows attended over (every row the step writes or reads must lie below it). last_only: the
        last position's logits only (a prefill chunk: the whole vocabulary for 512 rows is hundreds of MB)."""
        n = ids.shape[1]
        self.cache.rows = rows or self.size
        if self.dense is not None:
            hidden, feats = self.dense.run(ids, self.cache, self.cache.rows)
            logits = self.target.logits(hidden[-1:] if last_only else hidden)
            return logits, (feats if features else None)
        pos = self.cache.start + self.cache.offsets[:n]
        visible = self.cache.offsets[None, :self.cache.rows] <= pos[:, None]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=ids.device)
        mask = mask.masked_fill(~visible, torch.finfo(self.dtype).min)[None, None]
        if self.deltanet is not None:
            self.deltanet.verifying = verifying
            mask = {"full_attention": mask, "linear_attention": None}
        out = self.target.decoder(input_ids=ids, position_ids=pos[None], attention_mask=mask,
                                  past_key_values=self.cache, use_cache=True)
        hidden = out.last_hidden_state[0]
        logits = self.target.logits(hidden[-1:] if last_only else hidden)
        feats = self.target.captured_features()[0] if features and self.target._captured else None
        return logits, feats


class StaticDraftMixin:
    """DraftRunner with buffers sized once and every position explicit: set `start` (context positions
    cached) and `count` (how many of ctx_features' rows are real) before hidden()."""

    def make_static(self, size: int, kernels=None) -> None:
        self._reserve(size + 1)                        # + the spare row for padded context rows
        self.spare = self.keys[0].shape[1] - 1
        self.table = self._cos.shape[0]
        self.start = torch.zeros((), dtype=torch.long, device=self.device)
        self.count = torch.zeros((), dtype=torch.long, device=self.device)
        self.kernels = kernels

    def reset(self) -> None:
        self.start.zero_()
        self.length = 0

    def hidden(self, block_embeds: torch.Tensor, ctx_features: torch.Tensor) -> torch.Tensor:
        rows, n = ctx_features.shape[0], block_embeds.shape[0]
        r, j = torch.arange(rows, device=self.device), torch.arange(n, device=self.device)
        block_pos = self.start + self.count + j
        end = self.start + self.count + n
        self._write = torch.cat([torch.where(r < self.count, self.start + r, self.spare), block_pos])
        at = torch.cat([self.start + r, block_pos]).clamp(max=self.table - 1)
        cos, sin = self._cos[at], self._sin[at]
        ctx = _rms(self.fc(ctx_features.to(self.dtype)), *self.hidden_norm)
        x = block_embeds.to(self.dtype)
        self._end = end
        masks = ({} if self.kernels else
                 {kind: static_mask(end, n, self.spare + 1, *kind) for kind in set(self.mask_kinds)})
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, ctx, cos, sin, None, masks.get(self.mask_kinds[i]))
        return _rms(x, *self.final_norm)

    def _attention(self, i, layer, ctx, h, cos, sin, start, mask):
        c, n, d = ctx.shape[0], h.shape[0], layer.head_dim
        qh, kvh = layer.heads * d, layer.kv_heads * d
        qkv = layer.qkv(torch.cat([ctx, h]))
        q = _rms(qkv[c:, :qh].view(n, layer.heads, d), *layer.norms[2])
        k = _rms(qkv[:, qh:qh + kvh].view(c + n, layer.kv_heads, d), *layer.norms[3])
        v = qkv[:, qh + kvh:].view(c + n, layer.kv_heads, d)
        q = rope(q, cos[c:], sin[c:]).transpose(0, 1)
        self.keys[i].index_copy_(1, self._write, rope(k, cos, sin).transpose(0, 1))
        self.values[i].index_copy_(1, self._write, v.transpose(0, 1))
        if self.kernels is not None:
            out = self.kernels.cached_attention(q.contiguous(), self.keys[i], self.values[i], self._end.view(1),
                                                *self.mask_kinds[i])
        else:
            out = block_attention(q, self.keys[i], self.values[i], self.spare + 1, mask)
        return layer.o(out.transpose(0, 1).reshape(n, qh))


class StaticDraft(StaticDraftMixin, DraftRunner):
    pass


class StaticDraft2(StaticDraftMixin, Draft2Runner):
    pass


class StaticDSpark(StaticDraftMixin, DSparkRunner):
    pass


# drafter generation (engine/config.py) -> its runner with static buffers
STATIC_RUNNERS = {1: StaticDraft, 2: StaticDraft2, 3: StaticDSpark}


class Graphed:
    """fn() (no arguments: it reads static buffers) captured once as a CUDA graph and replayed after;
    eager when graphs are off. A capture that fails turns graphs off for this fn and says why.
    restore() lists the buffers fn both reads and writes (recurrent state): the warm-up runs put them back."""

    def __init__(self, fn, enabled: bool, restore=lambda: []):
        self.fn, self.enabled, self.graph, self.out, self.why_not = fn, enabled, None, None, None
        self.restore = restore

    def __call__(self):
        if not self.enabled:
            return self.fn()
        if self.graph is None:
            stream = torch.cuda.current_stream()
            saved = [(buffer, buffer.clone()) for buffer in self.restore()]
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):      # warm-up, then the buffers as they were: capture runs nothing
                        self.fn()
                        for buffer, before in saved:
                            buffer.copy_(before)
                torch.cuda.current_stream().wait_stream(side)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.out = self.fn()
            except RuntimeError as exc:     # an op that cannot be captured: stay eager, and say so
                torch.cuda.set_stream(stream)   # a failed capture can leave the capture stream current
                for buffer, before in saved:
                    buffer.copy_(before)
                self.enabled, self.graph, self.why_not = False, None, f"{type(exc).__name__}: {exc}"
                return self.fn()
        self.graph.replay()
        return self.out


class PendingDrafts(list):
    """Greedy drafts still on the device: placeholders until verify() reads them with its one transfer."""

    def __init__(self, tokens: torch.Tensor):
        super().__init__([-1] * tokens.shape[0])
        self.tokens = tokens


class CudaPair:
    """The static engine: the loop's operations over static caches and fixed-shape steps, sharing one
    answer's state and sampling with the eager engine (answer.py); load_pair picks it on CUDA for
    STATIC_ARCHITECTURES. graphs=False (and a CPU device) runs the same steps without capture; dense=False
    keeps transformers' layers where DenseDecoder would fit (the benchmark's comparison); compiled (on
    CUDA unless told) fuses DenseDecoder's small steps with torch.compile."""

    capabilities = frozenset()     # a step engine, as the eager one

    def __init__(self, target, drafter, tokenizer, name: str = "", family: str = "",
                 context: int | None = None, graphs: bool | None = None, use_kernels: bool | None = None,
                 bucket: int = BUCKET_ROWS, dense: bool = True, compiled: bool | None = None, vocab=None):
        hold(self, target, drafter, tokenizer, name, family, min(context or DEFAULT_CONTEXT, target.max_positions),
             vocab)
        on_cuda = self.device.type == "cuda"
        self.runner = None
        # a verify near the end still has room for its padded block, the drafter's or n-gram lookup's
        size = self.max_positions + max(self.block_size, NGRAM_BLOCK)
        self.kernels = _kernels() if (on_cuda if use_kernels is None else use_kernels) else None
        graphs = on_cuda if graphs is None else graphs
        # LLM.int8 picks its outlier columns per input and reads them on the host: it cannot be captured
        graphs = graphs and target.quantization != "int8"
        compiled = on_cuda if compiled is None else compiled
        self.static = StaticTarget(target, size, self.kernels, dense, compiled)
        B = self.block_size
        self._ids = {w: torch.zeros(1, w, dtype=torch.long, device=self.device) for w in {1, B, NGRAM_BLOCK}}
        self._features = drafter is not None      # fixed at capture: a drafter's pair always computes them
        deltanet = self.static.deltanet
        self._graphs, self._bucket = graphs, bucket
        self._restore = deltanet.buffers if deltanet is not None else (lambda: [])
        self._steps: dict[tuple[int, int], Graphed] = {}     # (width, rows) -> the step, made when first needed
        # a hybrid's commit reads the tapes of the verify before it, which are a verify graph's own buffers
        # when it replayed one: one commit graph per verify graph (each width and bucket has its own)
        self._commits: dict[Graphed, Graphed] = {}
        self._taped = False       # the last verify left DeltaNet tapes for commit()
        self._graphed_verify: Graphed | None = None     # the last verify's step, when it replayed a graph
        if drafter is not None:
            self.runner = STATIC_RUNNERS[drafter.generation](drafter, target.head.weight, runner_dtype(self.device),
                                                             self.vocab)
            self.runner.make_static(size + B, self.kernels)
            self._embeds = torch.zeros(drafter.config.input_width(B), target.hidden_size, dtype=self.runner.dtype,
                                       device=self.device)
            self._ctx = torch.zeros(B, drafter.fc.in_features, dtype=self.runner.dtype, device=self.device)
            self._draft_step = Graphed(lambda: self.runner.hidden(self._embeds, self._ctx), graphs)
        self._drafted_at = 0      # context positions the drafter has cached (host)
        self._out = torch.zeros(2, dtype=torch.long, device=self.device)

    def graph_status(self) -> dict:
        """Which steps run as CUDA graphs, and why one does not (for the benchmarks and bug reports)."""
        names = {g: f"{width}x{rows}" for (width, rows), g in self._steps.items()}
        steps = {name: g for g, name in names.items()}
        steps.update({f"commit after {names[v]}": c for v, c in self._commits.items()})
        steps.update(draft=getattr(self, "_draft_step", None))
        return {name: (g.graph is not None, g.why_not) for name, g in steps.items() if g is not None}

    def warm_up(self) -> None:
        """Compile and capture the usual steps now (prompts of two lengths, so the compiled prefill already
        takes any length; one-token and block-wide steps), so the first answer does not pay for them. It
        runs the steps itself, outside the loop: their times measure compiling, never a plain step."""
        settings = GenerationSettings(max_new_tokens=4, draft_cutoff=0.0, plain_fallback=False)
        for length in (5, 7):
            for width in ((1, self.block_size) if self.runner is not None else (1,)):
                last, pos = self.prefill([1] * length, settings, drafting=width > 1), length
                for _ in range(3):       # the loop's steps: draft (block-wide), verify, commit
                    drafts = self.draft(last, pos, width) if width > 1 else []
                    n, last = self.verify(last, pos, drafts)
                    pos += n + 1
                    self.commit(pos)

    def _step(self, width: int, end: int) -> Graphed:
        """The target step of this width attending over the rows a step ending at `end` needs."""
        rows = self.static.rows(end, self._bucket)
        if (width, rows) not in self._steps:
            self._steps[width, rows] = Graphed(
                lambda: self.static.run(self._ids[width], self._features, verifying=width > 1, rows=rows),
                self._graphs, self._restore)
        return self._steps[width, rows]

    @torch.inference_mode()
    def prefill(self, prompt, settings, drafting) -> int:
        a = self.answer
        a.start(settings, drafting, self.runner is not None,   # a GPU verifies whole blocks: a cutoff when asked
                0.0 if settings.draft_cutoff is None else settings.draft_cutoff, prompt)
        ids, feats = torch.tensor([prompt], device=self.device), []
        if self.static.deltanet is not None:
            self.static.deltanet.reset()
        self._taped = False
        for at in range(0, len(prompt), PREFILL_CHUNK):
            self.static.cache.start.fill_(at)
            chunk = ids[:, at:at + PREFILL_CHUNK]
            logits, f = self.static.run(chunk, self._features, last_only=True,
                                        rows=self.static.rows(at + chunk.shape[1], self._bucket))
            feats.append(f)
        self.static.cache.start.fill_(len(prompt))
        if a.drafting:
            a.context = [torch.cat(feats)]
            self.runner.reset()
            self._drafted_at = 0
        draft_over(self, settings)
        return a.choose(logits[-1:])

    @torch.inference_mode()
    def draft(self, last: int, pos: int, width: int) -> list[int]:
        a = self.answer
        if a.lookup is not None:
            return a.look_up(width)
        context, _ = a.unread_context()
        cfg, B, c = self.runner.config, self.block_size, context.shape[0]
        embeds = block_embeddings(self.target, cfg, last, cfg.input_width(width))
        self.runner.start.fill_(self._drafted_at)
        self.runner.count.fill_(c)
        if width == B and c <= B:           # the one fixed shape: replayed as a graph
            self._embeds.copy_(embeds)
            self._ctx[:c].copy_(context)
            hidden = self._draft_step()
        else:                               # the prompt's features, or a short block at the context's end
            hidden = self.runner.hidden(embeds, context)
        self._drafted_at += c
        if cfg.generation == 2:
            drafts, q, rows = self.runner.propose_from(hidden[1:], last, a.settings, a.gen)
            confidence = (None, rows)
        elif cfg.generation == 3:
            drafts, q, logits = self.runner.propose_from(hidden[cfg.first_draft:], last, a.settings, a.gen)
            confidence = (logits, q)
        else:
            logits = self.runner.head(hidden[1:]).float()
            drafts, q = propose(logits, a.settings, a.gen, self.runner.ids)
            confidence = (logits, q)
        drafts = a.keep_drafts(drafts, q, confidence)
        # the repeat penalty reads each row's drafts on the host, so they come over at once
        return PendingDrafts(drafts) if self.kernels is not None and not a.settings.penalized else drafts.tolist()

    @torch.inference_mode()
    def verify(self, last: int, pos: int, drafts: list[int]) -> tuple[int, int]:
        a, k = self.answer, len(drafts)
        tokens = (drafts.tokens if isinstance(drafts, PendingDrafts)
                  else torch.tensor(drafts, dtype=torch.long, device=self.device))
        width = 1 if k == 0 else NGRAM_BLOCK if a.lookup is not None else self.block_size
        ids = self._ids[width]
        ids[0, 0] = last
        ids[0, 1:k + 1] = tokens
        self.static.cache.start.fill_(pos)
        step = self._step(width, pos + width)
        logits, feats = step()
        self._graphed_verify = step if step.graph is not None else None
        logits = logits[: k + 1]
        q = a.take_q(k > 0)
        a.verified = (pos, feats)
        self._taped = width > 1 and self.static.deltanet is not None
        if self.kernels is None or a.settings.penalized:    # the penalty's rows differ: the torch pieces
            n, own = verify(tokens, q, logits, a.settings, a.gen, a.history.windows(last, drafts))
        elif isinstance(drafts, PendingDrafts):
            values = torch.cat([self._device_verify(tokens, q, logits), tokens]).tolist()   # the step's one read
            drafts[:] = values[2:]                                                          # n, token, the drafts
            n, own = values[:2]
        else:
            n, own = self._device_verify(tokens, q, logits).tolist()
        return a.kept(last, drafts, n, own)

    def _device_verify(self, tokens, q, logits) -> torch.Tensor:
        s, gen = self.answer.settings, self.answer.gen
        if s.greedy:
            return self.kernels.verify_greedy(tokens, logits.argmax(-1), self._out)
        p = probabilities(logits, s)
        if s.rule == "match":
            return self.kernels.verify_greedy(tokens, draw(p, gen), self._out)
        k = tokens.shape[0]
        if isinstance(q, Candidates):
            q = torch.zeros(k, p.shape[-1], device=p.device).scatter_(1, q.ids, q.probs.float())
        q = q if q is not None else p[:0]
        u = torch.rand(k + 1, generator=gen, device=p.device)
        return self.kernels.verify_sampled(p, q.float(), tokens, u[:k], u[k:], self._out)

    @torch.inference_mode()
    def commit(self, length: int) -> None:
        pos = self.answer.verified[0]
        self.static.cache.start.fill_(length)
        if self._taped:
            self.static.deltanet.keep.fill_(length - pos)
            if self._graphed_verify is not None:
                if self._graphed_verify not in self._commits:
                    self._commits[self._graphed_verify] = Graphed(self.static.deltanet.commit, self._graphs,
                                                                  self._restore)
                self._commits[self._graphed_verify]()
            else:
                self.static.deltanet.commit()   # an eager verify makes new tapes every step
            self._taped = False
        self.answer.commit(length, copy=True)   # the graph's output is overwritten next step

    def stop_drafting(self) -> None:
        self.answer.stop_drafting()

    def memory(self) -> dict:
        return memory(self.device)


def _kernels():
    """The Triton kernels, or None where Triton is missing (the torch pieces run instead)."""
    try:
        from . import kernels
    except ImportError:
        return None
    return kernels
