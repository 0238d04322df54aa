"""A pair run by llama-server: the target GGUF with its DFlash GGUF drafter, or alone, where it speculates
by n-gram lookup or decodes plainly (the same server binary either way, so the baseline is fair). Which
method answers use is measured when the pair loads (calibrate.py). Prompts go in as token ids and tokens come back as
ids, so the decode loop's text stream and stop rules work as with every engine.

What llama.cpp reports and what we derive: `timings` with every streamed token carries the running
drafted (draft_n) and accepted (draft_n_accepted) counts and the tokens generated, so verify steps are
tokens - 1 - accepted, tau follows, and the tokens of one step (the ones that share those counts) are its
accepted drafts followed by the target's own token. Per-slot acceptance is not reported.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ...config import GENERATION_METHODS
from ...errors import Cancelled, CheckpointError, EngineError
from ...limits import DEFAULT_CONTEXT, GenerationSettings
from .. import METHODS, Chunk
from ...tokenizer import ChatTokenizer
from ... import gguf_metadata as metadata, speculators
from ...draft_vocab import load as load_ranking
from . import GGUF_TYPES, NAME, build, calibrate, convert, cpu, gpu, vocab_head
from .server import Launch, Server, ServerError, StartCancelled, clean_env, request_body
from .tokens import ServerTokenizer


def _ggufs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.gguf") if p.is_file())


def find_target(target: Path, dtype: str, cancelled) -> Path:
    """A .gguf file, a folder holding one (several: the one named for dtype), or safetensors to convert."""
    if target.suffix.lower() == ".gguf":
        return target
    files = [p for p in _ggufs(target) if metadata.architecture(metadata.read_metadata(p)) not in DRAFTER_ARCHS]
    if len(files) > 1:
        files = [p for p in files if dtype and dtype.lower() in p.name.lower()] or files
        if len(files) > 1:
            raise CheckpointError(f"{target} holds several GGUF targets ({', '.join(p.name for p in files)}): "
                                  "name one file, or keep one per folder.")
    if files:
        return files[0]
    if not (target / "config.json").is_file():
        raise CheckpointError(f"{target} holds neither a .gguf file nor a model (config.json and safetensors) "
                              "to convert. Check the path or download the model again.")
    return convert.target_gguf(target, dtype, cancelled)


# GGUF drafter architectures: each the method it drafts for (a dflash one with a Markov head drafts for DSpark, a
# gemma4-assistant one for MTP: metadata.drafter_method)
DRAFTER_ARCHS = tuple(metadata.DRAFTER_METHODS)


def find_draft(draft: Path, target: Path, dtype: str, cancelled) -> Path:
    """A DFlash, DSpark, EAGLE-3 or Gemma 4 assistant .gguf file or a folder holding one, or a z-lab DFlash,
    DSpark, EAGLE-3 or Gemma 4 assistant drafter folder to convert for the target."""
    if draft.suffix.lower() == ".gguf":
        return draft
    files = [p for p in _ggufs(draft) if metadata.architecture(metadata.read_metadata(p)) in DRAFTER_ARCHS]
    if files:
        return files[0]
    if not (draft / "config.json").is_file():
        raise CheckpointError(f"{draft} holds neither a DFlash, DSpark, EAGLE-3 or Gemma 4 assistant .gguf drafter "
                              "nor a drafter (config.json and safetensors) to convert.")
    tokenizer_dir = target if target.is_dir() else target.parent
    if not (tokenizer_dir / "config.json").is_file():
        raise CheckpointError(f"Converting the drafter in {draft} needs its target's config.json and tokenizer "
                              f"files beside the target, and {tokenizer_dir} has none.")
    return convert.draft_gguf(draft, tokenizer_dir, dtype, cancelled)


def sidecar_drafter(target_file: Path, tmeta: dict) -> Path | None:
    """A DFlash (or DFlash2) GGUF drafter for this target lying beside it, as llama.cpp's own tools and other
    apps find them (`*DFlash*.gguf`, `dflash-*.gguf`): the first whose metadata pairs with the target."""
    for candidate in _ggufs(target_file.parent):
        if candidate == target_file or "dflash" not in candidate.name.lower():
            continue
        try:
            metadata.check_pair(tmeta, metadata.read_metadata(candidate), target_file.name, candidate.name)
        except EngineError:
            continue
        return candidate
    return None


def load_pair(target_dir, draft_dir=None, device: str = "auto", dtype: str | None = None,
              progress: Callable[[str, str], None] | None = None,
              cancelled: Callable[[], bool] = lambda: False, draft_vocab: int | None = None) -> "LlamaCppPair":
    """draft_vocab: how many of the drafter's ranked tokens it drafts from (0: all; None: the measured default,
    engine/draft_vocab.py); chosen here, with the servers, not per answer."""
    def report(stage: str, message: str) -> None:
        if cancelled():
            raise Cancelled("Loading was cancelled; nothing is loaded.")
        if progress is not None:
            progress(stage, message)

    if device not in ("auto", "cpu", *gpu.BUILDS_FOR):
        raise EngineError(f"The llama.cpp engine runs on the CPU or a GPU ({', '.join(gpu.BUILDS_FOR)}), not on "
                          f"{device!r}.", code="device_unavailable")
    on_gpu, note = None, None
    if device == "auto":
        device = gpu.found_gpu() or "cpu"        # a GPU build that sees a GPU uses it; else, quietly, the CPU
    if device in gpu.BUILDS_FOR:
        report("device", "Looking for the GPU")
        try:
            binary = gpu.gpu_build(device)
            on_gpu = (device, gpu.best(gpu.list_devices(binary, clean_env())))
        except gpu.NoGpu as exc:
            note = f"{exc} Running on the CPU instead."
            report("device", note)
    target = Path(target_dir)
    asked, dtype = dtype, dtype or "float32"
    if draft_dir is not None and Path(draft_dir).is_dir():    # a speculators drafter: its import, vocabulary and all
        draft_dir = speculators.imported(Path(draft_dir), report, "llamacpp")
    report("convert", f"Preparing {target.name} for llama.cpp")
    target_file = find_target(target, dtype, cancelled)
    tmeta = metadata.read_metadata(target_file)
    arch = metadata.architecture(tmeta)
    draft_file, block, beside, dmeta = None, 1, False, None
    if draft_dir is None and (target.suffix.lower() == ".gguf" or target_file.parent == target):
        # only beside a GGUF the user brought, never in our cache of conversions (drafters live there too)
        draft_dir = sidecar_drafter(target_file, tmeta)
        beside = draft_dir is not None
        if beside:
            report("drafter", f"Found the drafter {draft_dir.name} beside {target_file.name}")
    if draft_dir is not None:
        report("drafter", f"Preparing the drafter {Path(draft_dir).name} for llama.cpp")
        # unasked, a drafter follows the target's file (a quantized one: float16), as when the picker names its type
        draft_file = find_draft(Path(draft_dir), target, asked or _file_type(tmeta), cancelled)
        dmeta = metadata.read_metadata(draft_file, tensors=True)
        metadata.check_pair(tmeta, dmeta, target_file.name, draft_file.name)
        block = drafter_block(dmeta)

    def drafter(gpu_run: bool) -> tuple[Path | None, tuple[int, ...] | None]:
        """The drafter file a run on the GPU or the CPU starts with, and the draft vocabulary its head holds."""
        if draft_file is None:
            return None, None
        folder = Path(draft_dir) if Path(draft_dir).is_dir() else Path(draft_dir).parent
        subset = drafting_vocabulary(folder, dmeta, tmeta, draft_vocab, gpu_run)
        if not subset:
            return draft_file, None
        report("drafter", f"Giving the drafter a head of its {len(subset)} most frequent tokens")
        try:
            return vocab_head.cached_subset(draft_file, target_file, subset), subset
        except (NotImplementedError, ValueError, OSError, ImportError) as exc:   # a speed-up: never a failed load
            report("drafter", f"The drafter drafts over every token: its smaller head could not be made ({exc}).")
            return draft_file, None
    context = min(DEFAULT_CONTEXT, int(tmeta.get(f"{arch}.context_length") or DEFAULT_CONTEXT))
    launch = Launch(build.server_binary(), target_file, context=context, repack=cpu.repack_safe(),
                    device="none" if build.backend_of(build.find_build()) != "cpu" else None)
    tokenizer_dir = target if target.is_dir() else target.parent
    if on_gpu:
        name, card = on_gpu
        layers = int(tmeta.get(f"{arch}.block_count") or 0)
        offload = gpu.layers_on_gpu(card.free, target_file.stat().st_size, layers,
                                    2 * context * metadata.kv_width(tmeta) * 2,     # keys and values in float16
                                    draft_file.stat().st_size if draft_file else 0)
        if offload == 0:
            on_gpu, note = None, (f"{target_file.name} does not fit in the memory of {card.description} "
                                  f"({card.free / 2**30:.1f} GB free). Running on the CPU instead.")
            report("device", note)
    if on_gpu:
        gpu_note = None if offload == layers else (
            f"{offload} of {layers} layers of {target_file.name} fit in the memory of {card.description} "
            f"({card.free / 2**30:.1f} GB free); the other {layers - offload} run on the CPU, which is slower. "
            "A smaller model or a shorter context would fit whole.")
        if gpu_note:
            report("device", gpu_note)
        report("weights", f"Starting llama-server with {target_file.name} on {card.description}")
        try:
            return _start(replace(launch, binary=binary, gpu_layers=gpu.ALL_LAYERS if offload == layers else offload,
                                  device=card.name), *drafter(True), block, tmeta, tokenizer_dir, arch, beside,
                          report, cancelled, (name, card, gpu_note))
        except ServerError as exc:
            if isinstance(exc, StartCancelled) or not gpu.out_of_memory(exc.log_lines):
                raise
            note = (f"{target_file.name} does not fit in the memory of {card.description} "
                    f"({card.free / 2**30:.1f} GB free). Running on the CPU instead; a smaller model or a shorter "
                    "context would fit.")
            report("device", note)
    report("weights", f"Starting llama-server with {target_file.name}")
    return _start(launch, *drafter(False), block, tmeta, tokenizer_dir, arch, beside, report, cancelled,
                  ("cpu", None, note))


def _start(launch: Launch, draft_file, subset: tuple[int, ...] | None, block: int, tmeta: dict, tokenizer_dir: Path,
           arch: str, beside: bool, report, cancelled, where: tuple) -> "LlamaCppPair":
    """The pair on its servers, drafting checked and calibrated; where: (device, GPU, why not the GPU); subset:
    the draft vocabulary its drafter's head holds (None: every token)."""
    pair = LlamaCppPair(launch, draft_file, block, tmeta, tokenizer_dir)
    device, card, note = where
    pair.draft_vocab = len(subset) if subset else None      # every answer's, for its stats
    pair.info.update(device=device, gpu=card.description if card else None, device_note=note,
                     gpu_layers=launch.gpu_layers, draft_vocab=pair.draft_vocab)
    try:
        if draft_file is not None:
            report("drafter", "Starting llama-server with the drafter")
            if not pair.start_drafting(arch, optional=beside):
                report("drafter", f"llama.cpp cannot draft for this {arch!r} model with the drafter beside it")
        names = " and ".join(METHODS[m] for m in pair.methods if m != "none")
        report("tuning", f"Measuring {names} against plain decoding on this computer")
        pair.calibrate(calibrate.choose(pair, cancelled))
    except BaseException:
        pair.close()
        raise
    return pair


def drafting_vocabulary(draft_dir: Path, dmeta: dict, tmeta: dict, size: int | None, on_gpu: bool
                        ) -> tuple[int, ...] | None:
    """The token ids a DFlash drafter drafts from (engine/draft_vocab.py), or None for every token: no ranking
    beside it, a drafter with its own head, a DFlash2 or DSpark one (their selector and Markov head score every
    token), or size 0."""
    if metadata.drafter_method(dmeta) != "dflash" or "output.weight" in dmeta["gguf.tensors"]:
        return None
    vocab = load_ranking(draft_dir, metadata.vocab_size(tmeta))
    if vocab is None:
        return None
    return vocab.chosen(size, not on_gpu)


def drafter_block(meta: dict) -> int:
    """The most tokens one drafting step commits, its drafts and the target's own token, as llama-server drafts
    (common/speculative.cpp): DFlash and DFlash2 fill a block after the last token, block_size - 1 drafts; DSpark drafting
    from that token itself (sample_from_anchor: DeepSpec's drafters, and llama.cpp's default) all block_size;
    EAGLE-3 and a Gemma 4 assistant (MTP) one token a pass, up to their longest calibrated draft."""
    method = metadata.drafter_method(meta)
    if method == "eagle3":
        return calibrate.EAGLE3_CANDIDATES[-1] + 1
    if method == "mtp":
        return calibrate.MTP_CANDIDATES[-1] + 1
    block = int(meta.get("dflash.block_size") or 16)
    return block + 1 if method == "dspark" and meta.get("dflash.sample_from_anchor", True) else block


DEFAULT_DRAFTS = {"ngram": 8, "mtp": 2}   # drafts per step when asked for before a calibration measured them
NGRAM_BLOCK = calibrate.NGRAM_CANDIDATES[-1] + 1   # a step's most tokens without a drafter: n-gram's longest + 1


class LlamaCppPair:
    """A loaded pair; one llama-server at a time, restarted when a setting fixed at its start changes."""

    capabilities = frozenset({"stream", "stop_drafting", "interrupt", "plain_step_s", "close", "prepare"})

    def __init__(self, launch: Launch, draft: Path | None, block_size: int, meta: dict, tokenizer_dir: Path):
        self.base, self.draft = launch, draft
        # the method the drafter drafts for (dflash, dflash2, dspark, eagle3, mtp: a Gemma 4 assistant)
        self.drafter = metadata.drafter_method(metadata.read_metadata(draft, tensors=True)) if draft else None
        # what this pair's files allow (engine.backends.METHODS): n-gram lookup always, MTP where the target's GGUF
        # keeps its own head or the drafter is an assistant, and the drafter's method
        arch = metadata.architecture(meta)
        mtp = ("mtp",) if int(meta.get(f"{arch}.nextn_predict_layers") or 0) > 0 else ()
        self.methods = ("none", "ngram", *dict.fromkeys((*mtp, *((self.drafter,) if draft else ()))))
        # the most tokens one step can commit: the drafter's block, or n-gram lookup's longest draft + 1
        self.block_size = block_size if draft else NGRAM_BLOCK
        # On a CPU llama.cpp's flash attention is the slower path for a verify's block of queries, and for one
        # decoding query once the context is long; its plain matrix products win (docs/BENCHMARKS.md, "Flash
        # attention off on the CPU"). A GPU keeps llama.cpp's own choice.
        self.flash_attn = "off" if launch.gpu_layers == 0 else "auto"
        # Plain decoding at a short context can be faster the other way (llama.cpp's own flags: SmolLM2's chats
        # decode about 10% faster with them here): calibration measures both and keeps the faster for it.
        self.plain_flash_attn: str | None = None
        self.server: Server | None = None
        self.choice: dict | None = None
        self.cancelled: Callable[[], bool] = lambda: False   # the running generation's cancel (engine/loop.py)
        self._suspect = False              # the last request was interrupted: is the server still answering?
        self._owner = threading.current_thread()
        self.max_positions = launch.context
        # the target's Hugging Face tokenizer when it is beside the GGUF, else the server's own
        self.tokenizer = ChatTokenizer.from_folder(tokenizer_dir, as_serialized=True) or ServerTokenizer(self, meta)
        self.server_for("none")            # plain: ready for /tokenize and a baseline at once
        self.eos_ids = tuple(self.tokenizer.eos_ids)
        arch = metadata.architecture(meta)
        dtype = _file_type(meta)
        self.info = {"engine": NAME, "device": "cpu", "dtype": dtype,
                     # quantized weights round a verify's products otherwise than one step's
                     # (docs/engines/llamacpp.md, "Exactness: up to rounding")
                     "exact": dtype in _FLOAT_NAMES.values(),
                     "architecture": arch, "name": launch.model.name, "block_size": self.block_size,
                     "has_drafter": draft is not None, "methods": list(self.methods), "has_tokenizer": True,
                     "chat_template": bool(self.tokenizer.has_template),
                     "supports_thinking": bool(self.tokenizer.supports_thinking),
                     "vocab_size": metadata.vocab_size(meta), "max_positions": self.max_positions,
                     "layers": int(meta.get(f"{arch}.block_count") or 0), "gguf": str(launch.model),
                     "draft_gguf": str(draft) if draft else None,
                     "drafter_generation": {m: g for g, m in GENERATION_METHODS.items()}.get(self.drafter)}

    def start_drafting(self, arch: str, optional: bool = False) -> bool:
        """Start the drafting server once while loading, so a target whose llama.cpp graph cannot hand a
        DFlash drafter its layers is refused now, by what the server itself says, not mid-answer. optional (a
        drafter found beside the model, not asked for): such a target decodes plainly instead; False then."""
        try:
            self.server_for(self.drafter, self.block_size - 1)
            return True
        except ServerError as exc:
            said = "\n".join(exc.log_lines) + str(exc)
            if not ("layer input tensor" in said or "not extracted" in said):
                raise
            if optional:
                self.methods = tuple(m for m in self.methods if m != self.drafter)
                self.draft = self.drafter = None
                self.block_size = NGRAM_BLOCK
                self.info.update(block_size=self.block_size, has_drafter=False, draft_gguf=None,
                                 methods=list(self.methods), drafter_generation=None)
                self.server_for("none")
                return False
            raise CheckpointError(
                    f"llama.cpp's {METHODS[self.drafter]} cannot draft for this {arch!r} model: its graph in the "
                    "llama.cpp we build does not hand a drafter the target's layers. Plain decoding of it works "
                    "(load the model without its drafter), and the torch engine runs the pair from its Hugging "
                    "Face folder.", code="unsupported_architecture") from None

    def server_for(self, method: str, n_max: int = 0, fresh: bool = False) -> Server:
        """The running server when it matches, else a new one: plain decoding (method none), a drafting method
        started at n_max drafts per step, or n-gram lookup (started at its longest draft; each request sends its n_max).
        fresh: a new server even when one matches (n-gram lookup then starts with nothing remembered)."""
        if method == "none" or not n_max:
            method, n_max = "none", 0
        flags = self.flash_attn if n_max else (self.plain_flash_attn or self.flash_attn)
        n_max = calibrate.NGRAM_CANDIDATES[-1] if method == "ngram" else n_max
        want = replace(self.base, draft=self.draft if method == self.drafter else None, method=method, n_max=n_max,
                       flash_attn=flags)
        if self._suspect and self.server is not None:
            self._suspect = False
            if not self.server.healthy():
                self.stop_server(grace=0)      # cancelled while it had stopped answering: hung, so replaced
        if (not fresh and self.server is not None and self.server.launch == want
                and self.server.proc.poll() is None):
            return self.server
        self.stop_server()
        self.server = Server(want, cancelled=lambda: self.cancelled())
        return self.server

    def tokenizer_server(self) -> Server:
        """The server the GGUF's own tokenizer asks: the running one, else a plain one started now, but only on
        the thread that loaded the pair (a server's death signal follows the thread that started it)."""
        server = self.server
        if server is not None and server.proc.poll() is None:
            return server
        if threading.current_thread() is self._owner:
            return self.server_for("none")
        raise EngineError("The llama.cpp engine is starting again after a failure; try again in a moment.",
                          code="engine_crashed")

    def calibrate(self, choice: dict) -> None:
        """Answers follow the calibration's measured choice from now on (calibrate.choose)."""
        self.choice = choice
        self.plain_flash_attn = choice.get("plain_flash_attn")
        self.info.update(speculation=choice, method=choice["method"])
        self.server_for(choice["method"], choice["n_max"])

    def plan(self, settings: GenerationSettings, baseline: bool) -> tuple[str, int, dict | None]:
        """The method and drafts per step for this answer, and why plain decoding runs where speculation was
        asked for: the calibrated choice, or the block size setting's cap on it."""
        if baseline:
            return "none", 0, None
        choice = self.choice or {"method": self.drafter or "none", "n_max": self.block_size - 1}
        method, n_max = choice["method"], choice["n_max"]
        if settings.method is not None:        # asked for by name (the speedup demo's races): its measured best
            method = settings.method
            n_max = ((choice.get("by_method") or {}).get(method) or {}).get("n_max") or (
                self.block_size - 1 if method == self.drafter else DEFAULT_DRAFTS[method])
        elif settings.block_size and self.draft:    # the block size setting is the drafter's: its method at that width
            method = self.drafter
        elif method == "none" and not settings.plain_fallback:  # speculation asked for where plain measured faster
            method, n_max = calibrate.fastest_drafting(choice) or (method, n_max)
        if method != "none" and settings.block_size:
            n_max = min(settings.block_size, self.block_size) - 1
        if method != "none" or not self.choice:
            return method, n_max, None
        return "none", 0, {"after_tokens": 0, "reason": choice["reason"], "tau": choice.get("tau", 0.0),
                           "speed_share": choice.get("speed_share", 0.0)}

    @property
    def plain_step_s(self) -> float | None:
        """Seconds per plain token as calibration measured it (the loop's plain fallback starts from this)."""
        rate = float(((self.choice or {}).get("rates") or {}).get("none") or 0)
        return 1.0 / rate if rate > 0 else None

    def stop_drafting(self) -> None:
        """The rest of the current answer decodes plainly (the loop's fallback found its drafts not paying):
        stream() ends the request and continues on the same server, drafting nothing (our patch lets a
        request lower the server's drafts per step), over its cached prompt."""
        self._plain_rest = True

    def prepare(self, settings: GenerationSettings, baseline: bool) -> None:
        """Start the server this answer needs before its clock starts (the loop calls it). A request that names
        n-gram lookup gets one with nothing remembered: the speedup demo's races and benchmarks measure a first
        answer, never one it has drafted from an earlier answer to the same prompt."""
        method, n_max, _ = self.plan(settings, baseline)
        try:
            self.server_for(method, n_max, fresh=settings.method == "ngram")
        except StartCancelled:
            pass

    def stream(self, prompt: list[int], settings: GenerationSettings, baseline: bool):
        method, n_max, fallback = self.plan(settings, baseline)
        try:
            server = self.server_for(method, n_max)
        except StartCancelled:
            return
        if self.cancelled():
            return
        self._plain_rest = False
        body, received, accepted, earlier = request_body(prompt, settings), [], 0, None
        if n_max:
            body["speculative.n_max"] = n_max      # n-gram lookup's server drafts up to its longest
        while True:
            steps = self._steps(server, body, fallback, earlier)
            try:
                for chunk, last in steps:
                    chunk.method = method if n_max else None   # what drafts, named in the answer's stats
                    yield chunk
                    received += chunk.tokens
                    accepted += sum(chunk.drafted or ())
                    if last:                   # the server ended the answer: nothing to continue
                        return
                    if self._plain_rest and n_max:
                        drafted = (chunk.totals or {}).get("drafted", 0)
                        break
            finally:
                steps.close()
            # Tokens the server sent after the last step handed on are dropped and decoded again, plainly;
            # the totals so far count what was handed on (every token after the first: a draft or a step).
            earlier = {"drafted": drafted, "accepted": accepted, "steps": len(received) - 1 - accepted}
            n_max, left = 0, settings.max_new_tokens - len(received)
            if left <= 0:
                return
            body = {**request_body(prompt + received, replace(settings, max_new_tokens=left)),
                    "speculative.n_max": 0}

    def _steps(self, server: Server, body: dict, fallback: dict | None, earlier: dict | None):
        """One request's tokens grouped into the server's steps: (Chunk, whether it is the request's last),
        each with the totals of the answer up to its step (earlier: those of the requests before it)."""
        events = server.stream(body, self.cancelled)
        group: list[int] = []                  # the tokens of the step being received
        key, accepted_before = (0, 0), 0
        base = earlier or {"drafted": 0, "accepted": 0, "steps": 0}
        totals = dict(base)
        ms = done_ms = 0.0                     # the server's decoding time: so far, and when the last step ended
        first = 0 if earlier else 1            # the answer's first token comes from the prefill, not a step
        try:
            for event in events:
                timings = event.get("timings") or {}
                drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
                if (drafted, accepted) != key and group:
                    # a new step: the previous one's tokens are its accepted drafts, then the target's own
                    yield _step(group, key[1] - accepted_before, totals, fallback, ms - done_ms), False
                    accepted_before, group, done_ms = key[1], [], ms
                ms = float(timings.get("predicted_ms", ms))
                totals = {"drafted": base["drafted"] + drafted, "accepted": base["accepted"] + accepted,
                          "steps": base["steps"] + max(int(timings.get("predicted_n", 0)) - first - accepted, 0)}
                key = (drafted, accepted)
                group += [int(t) for t in event.get("tokens") or []]
                if key == (0, 0) and group and not event.get("stop"):
                    yield _step(group, 0, totals, fallback, ms - done_ms), False   # nothing drafted yet: sent at once
                    group, done_ms = [], ms
                if event.get("stop"):
                    break
            yield _step(group, key[1] - accepted_before, totals, fallback, ms - done_ms), True
        except ServerError:
            self.stop_server()                 # a server that broke an answer is never reused, even before it has died
            raise
        finally:
            events.close()
            self._suspect = server.interrupted   # checked before the server's next request (server_for)

    def interrupt(self) -> None:
        """The loop's cancel, from another thread: wakes a read that waits on the server."""
        server = self.server
        if server is not None:
            server.interrupt()

    def memory(self) -> dict:
        return {"peak_bytes": self.server.memory() if self.server else 0}

    def stop_server(self, grace: float = 10.0) -> None:
        if self.server is not None:
            self.server.stop(grace)
            self.server = None

    def close(self) -> None:
        self.stop_server(grace=3.0)

    def __del__(self):
        self.stop_server()


def _step(tokens: list[int], accepted: int, totals: dict, fallback: dict | None, ms: float) -> Chunk:
    accepted = max(0, min(accepted, len(tokens) - 1)) if tokens else 0
    flags = [True] * accepted + [False] * (len(tokens) - accepted)
    return Chunk(tokens, flags, dict(totals), fallback, ms / 1000)


_FLOAT_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _file_type(meta: dict) -> str:
    name = GGUF_TYPES.get(meta.get("general.file_type"), f"gguf type {meta.get('general.file_type')}")
    return _FLOAT_NAMES.get(name, name)


def describe() -> dict:
    """The CPU build in use: its llama.cpp version, backend and patches, and the builds here (a device each)."""
    import json
    info = json.loads((build.find_build() / "BUILD.json").read_text(encoding="utf-8"))
    return {"version": f"llama.cpp from llama-cpp-python {info['llama_cpp_python']}", "backend": info["backend"],
            "patches": info["patches"], "devices": sorted({"cpu", *build.builds()})}
