"""Gated DeltaNet layers (Qwen3.5 / Qwen3.6 hybrids) on the CUDA path: fixed buffers, rollback on the device.

Every DeltaNet layer's convolution window and recurrent state live in one buffer each, allocated by the
first (prefill) forward and only written in place after, so the steps can be captured as CUDA graphs.
- A prefill or a one-token step advances the state (`verifying` False).
- A verify of the block reads the state without writing it and keeps its tape (the window with the block,
  and the delta rule's inputs), like hybrid.py does for the eager engine.
- `commit()` replays the whole tape with the decays and betas of the rejected tokens set to zero, which
  leaves the state exactly as it is for those tokens (the delta rule's own padding works that way), and
  takes the new window from the tape at `keep`, a device tensor. One shape, no host transfer, graphable.

The delta rule and the convolution are the functions of transformers' modeling module; a prefill may run
flash-linear-attention's kernels (when installed), every later step the rule's reference functions
(hybrid.reference says why)."""
from __future__ import annotations

import torch

from .static_kv import StaticKV
from .hybrid import _helpers, convolve, output, projections, reference


class StaticDeltaNet:
    def __init__(self, device: torch.device):
        self.keep = torch.zeros((), dtype=torch.long, device=device)   # tokens of the last verify to keep
        self.verifying = False
        self.windows: dict[int, torch.Tensor] = {}   # layer_idx -> [1, C, kernel - 1]
        self.states: dict[int, torch.Tensor] = {}    # layer_idx -> [1, v_heads, k_dim, v_dim]
        self.tapes: dict[int, tuple] = {}            # layer_idx -> (window with the block, q, k, v, g, beta)
        self.rules: dict[int, object] = {}           # layer_idx -> its modeling module's chunked reference rule

    def buffers(self) -> list[torch.Tensor]:
        """What a step reads and writes (Graphed's warm-up restores them)."""
        return [*self.windows.values(), *self.states.values()]

    def reset(self) -> None:
        for buffer in self.buffers():
            buffer.zero_()

    def forward(self, layer, x: torch.Tensor) -> torch.Tensor:
        idx, n, h = layer.layer_idx, x.shape[1], _helpers(layer)
        mixed, z, beta, g = projections(layer, x)
        if idx not in self.windows:
            self.rules[idx] = reference(layer, "torch_chunk_gated_delta_rule")
            self.windows[idx] = mixed.new_zeros(*mixed.shape[:2], layer.conv_kernel_size - 1)
        window = torch.cat([self.windows[idx], mixed], dim=-1)
        q, k, v = convolve(layer, window, n)
        state = self.states.get(idx)
        if self.verifying:
            out, _ = self.rules[idx](q, k, v, g=g, beta=beta, chunk_size=n, initial_state=state,
                                     output_final_state=False, use_qk_l2norm_in_kernel=True)
            self.tapes[idx] = (window, q, k, v, g, beta)
            return output(layer, out, z)
        # a prefill may take fla's chunked kernel; a one-token step the reference, as a verify does
        rule = reference(layer, "torch_recurrent_gated_delta_rule") if n == 1 else h.torch_chunk_gated_delta_rule
        out, new = rule(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
        if state is None:
            self.states[idx] = new.clone()
        else:
            state.copy_(new)
        self.windows[idx].copy_(window[:, :, -self.windows[idx].shape[-1]:])
        return output(layer, out, z)

    def commit(self) -> None:
        """Advance every layer by the first `keep` tokens of the last verify."""
        for idx, (window, q, k, v, g, beta) in self.tapes.items():
            n, history = q.shape[1], self.windows[idx].shape[-1]
            live = (torch.arange(n, device=q.device) < self.keep)[None, :, None]
            _, new = self.rules[idx](q, k, v, g=g * live, beta=beta * live, chunk_size=n,
                                     initial_state=self.states[idx], output_final_state=True,
                                     use_qk_l2norm_in_kernel=True)
            self.states[idx].copy_(new)
            at = self.keep + torch.arange(history, device=q.device)
            self.windows[idx].copy_(window.index_select(-1, at))


class StaticHybridKV(StaticKV):
    """StaticKV for the attention layers, StaticDeltaNet for the DeltaNet ones (hybrid.py's layer wrapper
    hands them to deltanet_forward)."""

    def __init__(self, size: int, device: torch.device):
        super().__init__(size, device)
        self.deltanet = StaticDeltaNet(device)

    def deltanet_forward(self, layer, x: torch.Tensor) -> torch.Tensor:
        return self.deltanet.forward(layer, x)
