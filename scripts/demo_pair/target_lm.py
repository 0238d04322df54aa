"""The demo pair's target: a small Qwen3 causal LM trained on packed token sequences, on a CPU.

Training is sized by WALL-CLOCK: a few steps are timed during the LR warm-up, and the number of
optimizer steps is chosen so that training (evaluations and checkpoints included) ends within the
budget. Because the machine may be shared, the plan is re-checked at every evaluation and the step
count is adjusted when the measured speed drifts; the cosine schedule follows a monotone progress
variable, so such a re-plan never makes the learning rate jump up.

A checkpoint (model, optimizer, progress, data position, elapsed time) is written every few minutes
to the work directory; running the same command again resumes from it and spends only what is left
of the budget. The data order is a pure function of (seed, step), so a resumed run sees exactly the
batches an uninterrupted one would have.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from engine.training.checkpoint import load_checkpoint, report_old_pickles, restore_training, save_checkpoint, training_checkpoint


@dataclass
class TargetModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    num_hidden_layers: int = 6
    head_dim: int = 64
    num_key_value_heads: int = 2
    intermediate_size: int | None = None  # default 3 * hidden_size
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    eos_token_id: int = 0
    pad_token_id: int = 2

    def to_hf(self):
        from transformers import Qwen3Config

        if self.hidden_size % self.head_dim:
            raise ValueError("hidden_size must be a multiple of head_dim")
        heads = self.hidden_size // self.head_dim
        if heads % self.num_key_value_heads:
            raise ValueError("attention heads must be a multiple of the KV heads")
        return Qwen3Config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size or 3 * self.hidden_size,
            hidden_act="silu",
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=True,
            attention_bias=False,
            attention_dropout=0.0,
            use_sliding_window=False,
            bos_token_id=None,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
        )


@dataclass
class TrainConfig:
    seq_len: int = 256
    batch_size: int = 16  # packed sequences per step
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 80
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    budget_s: float = 45 * 60  # wall-clock for the whole training, evaluations and checkpoints included
    max_steps: int | None = None  # optional hard cap (tiny runs)
    measure_after: int = 3  # steps skipped before timing (allocator / thread warm-up)
    measure_steps: int = 10  # steps timed to size the schedule
    eval_every: int = 200  # steps between held-out evaluations
    eval_max_windows: int = 256  # held-out windows per periodic evaluation (the final one uses all)
    checkpoint_every_s: float = 300.0
    log_every: int = 10
    seed: int = 1234
    num_threads: int = 2  # the most torch threads to use
    adaptive_threads: bool = True  # drop to one thread while other processes load the CPU
    replan_every: int = 20  # steps between checks of the plan against the measured speed
    replan_tolerance: float = 0.03  # re-plan when the remaining steps are off by more than this
    speed_window: int = 200  # recent steps averaged for re-planning (a mix of load phases)


class CpuGovernor:
    """Chooses the torch thread count on a shared machine (Linux; elsewhere a fixed count).

    With all cores busy, a low-priority process that runs one OpenMP thread per core is paced by
    whichever of its threads gets the least CPU, which can be several times slower than running on
    one thread (measured here: 573 tokens/s with 2 threads vs 1033 with 1 while a test suite ran).
    The load of OTHER processes is read from /proc/stat minus this process's own CPU time; above
    ``busy`` cores the governor uses one thread, below ``idle`` cores it goes back to the maximum.
    """

    def __init__(self, max_threads: int, adaptive: bool, log, busy: float = 0.6, idle: float = 0.3):
        self.max_threads = max(1, max_threads)
        self.adaptive = adaptive and self.max_threads > 1 and Path("/proc/stat").exists()
        self.log = log
        self.busy, self.idle = busy, idle
        self.min_interval_s = 2.0  # shorter windows make the /proc/stat tick counts too coarse
        self.up_delay_s = 15.0
        self._quiet_since = None
        self.switches = 0
        self.threads = self.max_threads
        torch.set_num_threads(self.threads)
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._sample() if self.adaptive else None

    def _sample(self):
        with open("/proc/stat") as f:
            # user nice system idle iowait irq softirq steal (guest time is already in user/nice)
            fields = [int(v) for v in f.readline().split()[1:9]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        t = os.times()
        return time.monotonic(), (sum(fields) - idle) / self._hz, t.user + t.system

    def others_load(self) -> float:
        """CPU cores used by other processes since the last call."""
        now = self._sample()
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        wall = max(1e-6, t1 - t0)
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / wall

    def update(self) -> bool:
        """Re-check the load; True when the thread count changed."""
        if not self.adaptive:
            return False
        if time.monotonic() - self._last[0] < self.min_interval_s:
            return False
        load = self.others_load()
        now = time.monotonic()
        want = self.threads
        if load > self.busy:
            want = 1
        if load < self.idle:
            # Test suites start and stop processes all the time: go back up only after the machine
            # has stayed quiet for a while, go down at once.
            self._quiet_since = self._quiet_since or now
            if now - self._quiet_since >= self.up_delay_s:
                want = self.max_threads
        else:
            self._quiet_since = None
        if want != self.threads:
            self.log(f"  other processes use {load:.1f} cores: torch threads {self.threads} -> {want}")
            self.threads = want
            self.switches += 1
            torch.set_num_threads(want)
            return True
        return False


def build_model(model_cfg: TargetModelConfig, seed: int):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    hf_cfg = model_cfg.to_hf()
    hf_cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(hf_cfg)


def count_parameters(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():  # tied weights are one tensor
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


# ----------------------------------------------------------------------------------------------
# Data: packed windows over one token stream, in an order that depends only on (seed, step).


class PackedBatches:
    """Batches of ``batch_size`` windows of ``seq_len`` tokens from a concatenated token stream.

    Each epoch uses a random start offset (so window boundaries move) and a random window order,
    both drawn from ``numpy.random.default_rng([seed, epoch])``.
    """

    def __init__(self, ids: np.ndarray, seq_len: int, batch_size: int, seed: int):
        self.ids = ids
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.windows_per_epoch = (len(ids) - seq_len) // seq_len
        if self.windows_per_epoch < 1:
            raise ValueError(
                f"training data has {len(ids)} tokens: too few for one window of {seq_len} tokens"
            )
        self._epoch_cache: dict[int, tuple[int, np.ndarray]] = {}

    def _epoch(self, e: int) -> tuple[int, np.ndarray]:
        if e not in self._epoch_cache:
            rng = np.random.default_rng([self.seed, e])
            offset = int(rng.integers(0, self.seq_len))
            self._epoch_cache = {e: (offset, rng.permutation(self.windows_per_epoch))}
        return self._epoch_cache[e]

    def epoch_of(self, step: int) -> float:
        return step * self.batch_size / self.windows_per_epoch

    def batch(self, step: int) -> torch.Tensor:
        rows = []
        for g in range(step * self.batch_size, (step + 1) * self.batch_size):
            e, i = divmod(g, self.windows_per_epoch)
            offset, perm = self._epoch(e)
            start = offset + int(perm[i]) * self.seq_len
            rows.append(self.ids[start : start + self.seq_len])
        return torch.from_numpy(np.stack(rows).astype(np.int64))


def eval_windows(ids: np.ndarray, seq_len: int) -> np.ndarray:
    n = len(ids) // seq_len
    if n < 1:
        raise ValueError(f"held-out data has {len(ids)} tokens: too few for one window of {seq_len}")
    return ids[: n * seq_len].reshape(n, seq_len).astype(np.int64)


@torch.no_grad()
def evaluate(model, windows: np.ndarray, batch_size: int, max_windows: int | None = None) -> float:
    """Mean next-token cross-entropy (nats/token) over held-out windows (evenly subsampled)."""
    if max_windows is not None and len(windows) > max_windows:
        idx = np.linspace(0, len(windows) - 1, max_windows).round().astype(int)
        windows = windows[idx]
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for s in range(0, len(windows), batch_size):
        x = torch.from_numpy(windows[s : s + batch_size])
        logits = model(input_ids=x).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
        )
        total += float(loss)
        count += x[:, 1:].numel()
    model.train(was_training)
    return total / count


# ----------------------------------------------------------------------------------------------
# Schedule: linear warm-up over steps, then cosine over a progress variable p in [0, 1].


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def advance_progress(progress: float, step: int, total_steps: int, warmup_steps: int) -> float:
    """Progress after finishing ``step``: moves 1/remaining of the way to 1, so it reaches exactly 1
    at the last step and equals the plain fraction when ``total_steps`` never changes."""
    if step < warmup_steps:
        return 0.0
    remaining = total_steps - step
    if remaining <= 1:
        return 1.0
    return progress + (1.0 - progress) / remaining


# ----------------------------------------------------------------------------------------------
# Checkpoints


@dataclass
class TrainState:
    step: int = 0
    progress: float = 0.0
    total_steps: int | None = None  # None until the speed has been measured
    train_elapsed_s: float = 0.0  # wall-clock spent so far, over all runs
    sec_per_step: float | None = None
    eval_s: float | None = None  # measured cost of one periodic evaluation
    history: list = field(default_factory=list)  # held-out evaluations
    replans: list = field(default_factory=list)
    resumed: int = 0


def fmt_s(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


def train_target(
    train_ids: np.ndarray,
    held_out_ids: np.ndarray,
    model_cfg: TargetModelConfig,
    cfg: TrainConfig,
    work_dir: Path | str,
    log: Callable[[str], None] = print,
):
    """Train (or resume) the target. Returns (model in fp32, summary dict)."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = work_dir / "target_checkpoint.safetensors"
    report_old_pickles(work_dir, ("target_checkpoint.pt",), log)
    # as JSON gives them back, to compare with a checkpoint's
    settings = json.loads(json.dumps({"model_cfg": asdict(model_cfg), "train_cfg": asdict(cfg)}))

    data = PackedBatches(train_ids, cfg.seq_len, cfg.batch_size, cfg.seed)
    held = eval_windows(held_out_ids, cfg.seq_len)
    model = build_model(model_cfg, cfg.seed)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
    )
    state = TrainState()
    if ckpt_path.exists():
        tensors, meta = load_checkpoint(ckpt_path)
        if meta["settings"] != settings:
            raise RuntimeError(
                f"checkpoint {ckpt_path} was made with other settings; delete it to start over"
            )
        restore_training(tensors, meta, model, opt)
        state = TrainState(**meta["state"])
        state.resumed += 1
        torch.set_rng_state(tensors["torch_rng"])
        log(
            f"resumed from {ckpt_path} at step {state.step}"
            f" ({fmt_s(state.train_elapsed_s)} of {fmt_s(cfg.budget_s)} already spent)"
        )

    n_params = count_parameters(model)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    log(
        f"target: {n_params / 1e6:.2f}M parameters, {len(train_ids):,} train tokens"
        f" ({data.windows_per_epoch} windows/epoch), {len(held)} held-out windows,"
        f" {tokens_per_step} tokens/step, budget {fmt_s(cfg.budget_s)}"
    )

    run_start = time.monotonic()
    base_elapsed = state.train_elapsed_s

    def elapsed() -> float:
        return base_elapsed + (time.monotonic() - run_start)

    def checkpoint_now() -> None:
        state.train_elapsed_s = elapsed()
        tensors, meta = training_checkpoint(model, opt)
        tensors["torch_rng"] = torch.get_rng_state()
        save_checkpoint(ckpt_path, tensors, {**meta, "state": asdict(state), "settings": settings})

    def run_eval(step: int, full: bool = False) -> float:
        t = time.monotonic()
        loss = evaluate(model, held, cfg.batch_size, None if full else cfg.eval_max_windows)
        dt = time.monotonic() - t
        if not full:
            state.eval_s = dt if state.eval_s is None else 0.5 * (state.eval_s + dt)
        state.history.append(
            {"step": step, "held_out_loss": round(loss, 4), "elapsed_s": round(elapsed(), 1), "full": full}
        )
        log(f"  held-out loss {loss:.4f} (ppl {math.exp(loss):.2f}) at step {step}, eval {dt:.1f}s")
        return loss

    def plan(done_steps: int, sec_per_step: float) -> int:
        """Total steps that fit in the rest of the budget at ``sec_per_step``."""
        remaining_s = cfg.budget_s - elapsed()
        eval_s = state.eval_s or 0.0
        ckpt_s = 1.0  # checkpoint writes are small
        # Reserve: a final full evaluation (~all windows) and the final save.
        final_eval_s = eval_s * max(1.0, len(held) / max(1, cfg.eval_max_windows)) + 5.0
        per_step = sec_per_step + eval_s / cfg.eval_every + ckpt_s * sec_per_step / max(1.0, cfg.checkpoint_every_s)
        more = max(0, int((remaining_s - final_eval_s) / per_step))
        total = done_steps + more
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        return max(total, done_steps + 1)

    governor = CpuGovernor(cfg.num_threads, cfg.adaptive_threads, log)
    if not state.history:
        time.sleep(min(2.0, cfg.budget_s / 100))  # a first load reading before choosing threads
        governor.update()
        run_eval(0)

    # Steps timed in this run (evaluations and checkpoints excluded) for the speed estimates.
    timed_steps, timed_s = 0, 0.0
    recent: deque[float] = deque(maxlen=cfg.speed_window)  # not cleared on thread switches
    since_switch: list[float] = []  # step times at the current thread count (initial sizing)
    last_ckpt = time.monotonic()
    loss_ema = None
    last_log_t, last_log_step = time.monotonic(), state.step
    run_first_step = state.step

    def more_steps() -> bool:
        if cfg.max_steps is not None and state.step >= cfg.max_steps:
            return False
        return state.total_steps is None or state.step < state.total_steps

    def maybe_replan() -> None:
        """Re-size the run from the recent speed when the projected end drifts off the budget."""
        if state.total_steps is None or len(recent) < min(cfg.measure_steps, recent.maxlen):
            return
        sec = sum(recent) / len(recent)
        state.sec_per_step = sec
        new_total = plan(state.step, sec)
        left = state.total_steps - state.step
        if left > 0 and abs(new_total - state.total_steps) > max(2, cfg.replan_tolerance * left):
            log(f"  re-plan: {sec:.3f} s/step recently, total steps {state.total_steps} -> {new_total}")
            state.replans.append({"at_step": state.step, "from": state.total_steps, "to": new_total})
            state.total_steps = new_total

    while more_steps():
        step = state.step
        lr = lr_at(cfg, step, state.progress)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.monotonic()
        x = data.batch(step)
        out = model(input_ids=x, labels=x)
        loss = out.loss
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.monotonic() - t0
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise FloatingPointError(f"training loss became {lv} at step {step}")
        loss_ema = lv if loss_ema is None else 0.95 * loss_ema + 0.05 * lv

        if step - run_first_step >= cfg.measure_after:  # skip this process's first steps
            timed_steps += 1
            timed_s += dt
            recent.append(dt)
            since_switch.append(dt)
        if governor.update():
            since_switch.clear()  # the first plan must come from the current thread count

        state.progress = (
            advance_progress(state.progress, step, state.total_steps, cfg.warmup_steps)
            if state.total_steps is not None
            else 0.0
        )
        state.step = step + 1

        # Size the schedule once the speed is known (first run, or a resume before sizing).
        if state.total_steps is None and len(since_switch) >= cfg.measure_steps:
            state.sec_per_step = sum(since_switch) / len(since_switch)
            state.total_steps = plan(state.step, state.sec_per_step)
            log(
                f"measured {state.sec_per_step:.3f} s/step ({tokens_per_step / state.sec_per_step:.0f} tokens/s):"
                f" planning {state.total_steps} steps = {state.total_steps * tokens_per_step / 1e6:.2f}M tokens"
                f" ({data.epoch_of(state.total_steps):.2f} epochs)"
            )
            if state.total_steps <= cfg.warmup_steps:
                log("  warning: the budget does not even cover the warm-up")

        if state.step % cfg.log_every == 0 or state.step == state.total_steps:
            now = time.monotonic()
            sps = (now - last_log_t) / max(1, state.step - last_log_step)
            last_log_t, last_log_step = now, state.step
            total = state.total_steps
            eta = 0.0
            if total:
                left = total - state.step
                eta = left * (state.sec_per_step or sps) + (left // cfg.eval_every) * (state.eval_s or 0.0)
            log(
                f"step {state.step}/{total or '?'} loss {lv:.3f} (ema {loss_ema:.3f}) lr {lr:.2e}"
                f" gnorm {float(gnorm):.2f} {tokens_per_step / sps:.0f} tok/s"
                f" threads {governor.threads} epoch {data.epoch_of(state.step):.2f}"
                f" elapsed {fmt_s(elapsed())}" + (f" ETA {fmt_s(eta)}" if total else "")
            )

        if not more_steps():
            break
        if state.step % cfg.eval_every == 0:
            governor.update()
            run_eval(state.step)
        if state.step % cfg.replan_every == 0:
            maybe_replan()
        if time.monotonic() - last_ckpt >= cfg.checkpoint_every_s:
            checkpoint_now()
            last_ckpt = time.monotonic()
            log(f"  checkpoint saved at step {state.step}")

    final_loss = run_eval(state.step, full=True)
    state.train_elapsed_s = elapsed()
    checkpoint_now()
    sec = timed_s / timed_steps if timed_steps else state.sec_per_step
    summary = {
        "parameters": n_params,
        "steps": state.step,
        "tokens_per_step": tokens_per_step,
        "train_tokens_seen": state.step * tokens_per_step,
        "epochs": round(data.epoch_of(state.step), 3),
        "train_tokens_in_corpus": int(len(train_ids)),
        "held_out_tokens": int(held.size),
        "held_out_loss": round(final_loss, 4),
        "held_out_ppl": round(math.exp(final_loss), 3),
        "final_train_loss_ema": round(loss_ema, 4) if loss_ema is not None else None,
        "train_time_s": round(state.train_elapsed_s, 1),
        "sec_per_step": round(sec, 4) if sec else None,
        "tokens_per_s": round(tokens_per_step / sec, 1) if sec else None,
        "eval_history": state.history,
        "replans": state.replans,
        "resumed": state.resumed,
        "thread_switches": governor.switches,
    }
    return model, summary


# ----------------------------------------------------------------------------------------------
# Export and quick generation


def save_target(model, out_dir: Path | str, tokenizer_dir: Path | str, model_cfg: TargetModelConfig) -> dict:
    """Save the model (bfloat16 safetensors), generation config and tokenizer files into ``out_dir``."""
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    export = build_model(model_cfg, seed=0)
    export.load_state_dict(model.state_dict())
    export = export.to(torch.bfloat16)
    export.config.use_cache = True
    export.generation_config = GenerationConfig(
        eos_token_id=model_cfg.eos_token_id,
        pad_token_id=model_cfg.pad_token_id,
        do_sample=False,
        max_new_tokens=256,
    )
    export.save_pretrained(str(out_dir), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = Path(tokenizer_dir) / name
        if src.exists():
            shutil.copy2(src, out_dir / name)
    files = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()}
    return {"files": files, "total_bytes": sum(files.values())}


@torch.no_grad()
def greedy_samples(model_dir: Path | str, prompts: list[str], max_new_tokens: int = 128) -> list[str]:
    """Greedy continuations from a saved target dir (loads it the way the app would)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, trust_remote_code=False).eval()
    outs = []
    for prompt in prompts:
        enc = tok(prompt, return_tensors="pt")
        if enc["input_ids"].shape[1] == 0:  # empty prompt: start a document as in training
            enc = tok(tok.eos_token, return_tensors="pt")
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
        outs.append(tok.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=False))
    return outs
