"""Every target model_type the llama.cpp engine claims (ARCHITECTURES) runs greedy DFlash losslessly through
our llama-server build: a tiny random target and its DFlash drafter (tests/tiny_torch.py) convert to float32
GGUF with our converter path, load as a pair, and decode token for token like plain llama.cpp and like the
torch engine on the same weights, through steps whose drafts are rejected and accepted in part; Gemma 4 in the
multimodal layout it ships in converts as its text model."""
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from engine.backends.llamacpp import ARCHITECTURES, build

try:
    build.find_build()
except build.BuildMissing as exc:
    pytest.skip(f"no llama.cpp build here ({exc})", allow_module_level=True)

from safetensors.torch import load_file, save_file  # noqa: E402

from engine.backends.llamacpp import calibrate, convert  # noqa: E402
from engine.backends.llamacpp.engine import load_pair  # noqa: E402
from engine.backends.torch.engine import load_pair as torch_pair  # noqa: E402
from engine.bench import DEMO_DIR  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from tests.tiny_torch import VARIANTS, save_random_pair  # noqa: E402

# model_type -> the architecture llama.cpp's converter writes it as (general.architecture)
GGUF_ARCH = {"qwen3": "qwen3", "llama": "llama", "qwen3_moe": "qwen3moe", "qwen3_5": "qwen35",
             "qwen3_5_moe": "qwen35moe", "gpt_oss": "gpt-oss", "gemma4": "gemma4"}
BLOCK, TOKENS = 8, 32
# 8 random ids each; with these seeds every architecture's answers have steps that accept none and some of the drafts
PROMPTS = [torch.randint(1, 4000, (8,), generator=torch.Generator().manual_seed(s)).tolist() for s in (0, 2, 3)]
STEERED = 300         # the token the drafter drafts (steer)
HEAD_SCALE = 10.0
TIE = 1e-3 * HEAD_SCALE   # the best two logits this close are a float-rounding tie (test_llamacpp_engine.py's,
                          # scaled with the sharpened head)
ROUTE_TIE = 1e-4      # a mixture-of-experts layer's last chosen and first passed-over expert this close: a rounding tie


def test_every_claimed_architecture_has_a_stand_in_here():
    assert set(ARCHITECTURES) <= set(VARIANTS) and set(ARCHITECTURES) <= set(GGUF_ARCH)


@pytest.fixture(scope="module", autouse=True)
def app_home(tmp_path_factory):
    """Conversions go to a fresh app folder; calibration (timed answers, a minute a pair) is skipped, since every
    answer here names its block size."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_DESKTOP_HOME", str(tmp_path_factory.mktemp("home")))
        mp.setattr(calibrate, "choose", lambda pair, cancelled=None, force=False: {
            "method": pair.drafter or "none", "n_max": pair.block_size - 1, "reason": "not measured in tests",
            "plain_flash_attn": "off"})
        yield


def steer(target, mask_id: int) -> None:
    """A random drafter never guesses a random target's tokens, so every draft would be rejected. The head (the
    drafter's too) is sharpened, and STEERED's head row and the mask token's embedding point one way: the drafter
    drafts STEERED at every masked position, and the target writes it where its state leans that way, in runs
    that end inside a block."""
    path = target / "model.safetensors"
    weights = load_file(path)
    head, embed = weights["lm_head.weight"], weights["model.embed_tokens.weight"]
    way = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
    way /= way.norm()
    head.mul_(HEAD_SCALE)
    head[STEERED] = 30.0 * way
    embed[mask_id] = 100.0 * way
    save_file(weights, path, metadata={"format": "pt"})


def edit_config(folder, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}), encoding="utf-8")


def gemma_tokenizer(size: int = 4352):
    """A small tokenizer in Gemma's form (byte-fallback BPE over text with spaces as '▁', a Sequence decoder), the
    only form llama.cpp's Gemma 4 converter reads (gguf-py's LlamaHfVocab); 4352 ids, so PROMPTS fit, with
    <|mask|> for the DFlash drafter."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<|mask|>"]
    vocab = {t: i for i, t in enumerate([*specials, *(f"<0x{b:02X}>" for b in range(256)),
                                         *(chr(c) for c in range(33, 127)), "▁"])}
    letters, merges = "▁etaoinshrdlucmfwypvbgkjqxz", []
    for left in [*letters, *(a + b for a in letters for b in letters)]:   # pairs, then triples, up to size
        for right in letters:
            if len(vocab) < size and left in vocab and left + right not in vocab:
                merges.append((left, right))
                vocab[left + right] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    core.normalizer = normalizers.Replace(" ", "▁")
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<pad>", additional_special_tokens=["<|mask|>"])


def tiny_pair(root, arch: str):
    """The target and drafter folders, and the target folder llama.cpp is given (the same, but for Qwen3.5 MoE)."""
    tokenizer, layers = DEMO_DIR / "target", 4                # a tokenizer llama.cpp's converter knows
    if arch == "gemma4":
        # llama.cpp converts Gemma 4 only with a tokenizer in Gemma's form; and its KV sharing takes the last
        # unshared layers to be a sliding then a full one, as in real Gemma 4s: 5 layers (sliding, sliding, full,
        # then 2 sharing: sliding, full) have that
        tokenizer, layers = root / "tokenizer", 5
        gemma_tokenizer().save_pretrained(tokenizer)
    target, draft = save_random_pair(root, arch=arch, block_size=BLOCK, hidden=64, layers=layers,
                                     tokenizer_dir=tokenizer)
    steer(target, json.loads((draft / "config.json").read_text())["dflash_config"]["mask_token_id"])
    if arch == "qwen3_moe":
        # as Qwen3 MoE checkpoints have it (transformers' default is off); llama.cpp's qwen3moe graph always
        # renormalises the chosen experts' weights
        edit_config(target, norm_topk_prob=True)
    served = target
    if arch == "qwen3_5_moe":
        # transformers loads a qwen3_5_moe_text folder's tokenizer as its Qwen3.5 class whatever the folder names,
        # re-splitting the demo tokenizer's text as Qwen's, and the converter's pre-tokenizer check knows no such
        # tokenizer (real Qwen3.5 MoE checkpoints ship Qwen's own, which it knows). Under a model_type transformers
        # does not know, the folder's own tokenizer is used; the converter reads config.json as it is.
        served = root / "served"
        shutil.copytree(target, served)
        edit_config(served, model_type="tiny_qwen3_5_moe")
    return target, draft, served


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def answers(request, tmp_path_factory):
    """Each prompt's greedy answer from the torch engine, plain llama.cpp and DFlash in llama.cpp, with the drafts
    each DFlash step accepted."""
    arch = request.param
    target, draft, served = tiny_pair(tmp_path_factory.mktemp(arch), arch)
    reference = torch_pair(target)
    with ThreadPoolExecutor(2) as pool:   # both conversions at once (mostly the converter's start); load_pair finds them
        for done in [pool.submit(convert.target_gguf, served, "float32"), pool.submit(convert.draft_gguf, draft, served)]:
            done.result()
    pair = load_pair(served, draft, dtype="float32")
    plain_settings = GenerationSettings(max_new_tokens=TOKENS)
    try:
        info = dict(pair.info)
        plain = [Generation(pair, p, plain_settings, baseline=True).run() for p in PROMPTS]
        runs = [Generation(pair, p, GenerationSettings(max_new_tokens=TOKENS, block_size=BLOCK, plain_fallback=False))
                for p in PROMPTS]
        accepted = [[sum(chunk.drafted) for chunk in run if chunk.tokens][1:] for run in runs]   # after the prefill's
    finally:
        pair.close()
    torch_tokens = [Generation(reference, p, plain_settings, baseline=True).run().tokens for p in PROMPTS]
    return SimpleNamespace(arch=arch, info=info, reference=reference, torch=torch_tokens, plain=plain, dflash=runs,
                           accepted=accepted)


def routing_tie(reference, ids: list[int]) -> bool:
    """Whether a mixture-of-experts layer chose the experts of the last position by a rounding tie."""
    model = reference.target.model
    k = getattr(model.config.get_text_config(), "num_experts_per_tok", None)
    if not k:
        return False
    margins = []

    def hook(module, inputs, _output):
        logits = torch.nn.functional.linear(inputs[0].reshape(-1, inputs[0].shape[-1])[-1], module.weight,
                                            getattr(module, "bias", None)).sort(descending=True).values
        margins.append(float(logits[k - 1] - logits[k]))
    hooks = [m.register_forward_hook(hook) for name, m in model.named_modules() if name.endswith(("mlp.gate", "mlp.router"))]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return min(margins) < ROUTE_TIE


def assert_same_up_to_rounding(got: list[int], want: list[int], prompt: list[int], reference, what: str) -> None:
    """got == want, or they part where float rounding may pick either: the target's best two logits are a tie (got
    took the other), or a mixture-of-experts layer's choice of experts is."""
    i = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
    if i is None:
        assert len(got) == len(want), f"{what}: {len(got)} tokens, not {len(want)}"
        return
    if routing_tie(reference, prompt + want[:i]):
        return
    with torch.no_grad():
        logits = reference.target.model(torch.tensor([prompt + want[:i]])).logits[0, -1].float()
    top = logits.topk(2)
    assert set(top.indices.tolist()) == {want[i], got[i]}, f"{what}, token {i}: {got[i]} is not the runner-up of {want[i]}"
    assert float(top.values[0] - top.values[1]) < TIE, f"{what}, token {i}: not a tie ({top.values.tolist()})"


def test_the_target_converts_as_its_own_llamacpp_architecture(answers):
    assert answers.info["architecture"] == GGUF_ARCH[answers.arch] and answers.info["dtype"] == "float32"
    assert answers.info["has_drafter"] and answers.info["block_size"] == BLOCK


def test_plain_llamacpp_decodes_like_the_torch_engine(answers):
    for prompt, want, plain in zip(PROMPTS, answers.torch, answers.plain):
        assert plain.stats.drafted == 0
        assert_same_up_to_rounding(plain.tokens, want, prompt, answers.reference, f"{answers.arch}: plain llama.cpp")


def test_greedy_dflash_decodes_like_plain_decoding(answers):
    for prompt, want, plain, fast in zip(PROMPTS, answers.torch, answers.plain, answers.dflash):
        assert fast.stats.drafted > 0 and fast.stats.unknown == ()
        assert_same_up_to_rounding(fast.tokens, want, prompt, answers.reference, f"{answers.arch}: DFlash in llama.cpp")
        assert_same_up_to_rounding(fast.tokens, plain.tokens, prompt, answers.reference,
                                   f"{answers.arch}: DFlash against plain llama.cpp")


def test_steps_reject_all_drafts_and_accept_some(answers):
    """The rollbacks DFlash needs: every draft of a step rejected, and a step that keeps some drafts and drops the
    rest (an answer's last step may be cut short by its length, so it is not counted)."""
    steps = {n for answer in answers.accepted for n in answer[:-1]}
    assert 0 in steps and steps & set(range(1, BLOCK - 1)), f"{answers.arch}: drafts accepted per step {answers.accepted}"


def test_gemma4_as_published_converts_as_its_text_model(tmp_path):
    """Gemma 4 ships as Gemma4ForConditionalGeneration (model_type gemma4, the text model under
    model.language_model. beside a vision tower): llama.cpp's converter takes it as it is, leaving the tower out,
    and plain llama.cpp decodes it as the torch engine does (its text decoder)."""
    import transformers as tf

    from tests.tiny_torch import target_config
    tok = gemma_tokenizer()
    text = target_config("gemma4", vocab=len(tok), hidden=64, layers=5)
    vision = tf.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=2, head_dim=16, patch_size=8, position_embedding_size=64,
                                   pooling_kernel_size=2)
    cfg = tf.Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                          image_token_id=5, boi_token_id=6, eoi_token_id=7, video_token_id=8, boa_token_id=9,
                          eoa_token_index=10, audio_token_id=11)
    torch.manual_seed(0)
    tf.Gemma4ForConditionalGeneration(cfg).save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    assert json.loads((tmp_path / "target" / "config.json").read_text())["model_type"] == "gemma4"
    reference, pair = torch_pair(tmp_path / "target"), load_pair(tmp_path / "target", dtype="float32")
    try:
        assert pair.info["architecture"] == "gemma4" and pair.info["methods"] == ["none", "ngram"]
        for prompt in PROMPTS:
            want = Generation(reference, prompt, GenerationSettings(max_new_tokens=TOKENS), baseline=True).run()
            plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=TOKENS), baseline=True).run()
            assert_same_up_to_rounding(plain.tokens, want.tokens, prompt, reference, "gemma4 as published: plain")
    finally:
        pair.close()
