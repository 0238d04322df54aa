"""Speculation methods other than DFlash in the llama.cpp engine, on real servers: n-gram lookup gives plain
decoding's greedy tokens on the demo pair and on SmolLM2 (a real model), and so does a target's own MTP head (a
tiny random Qwen3.5 with one, converted keeping it), Gemma 4's MTP drafter (a random assistant checkpoint beside a
tiny random Gemma 4; one made for another model is refused by name), an EAGLE-3 drafter (random, SpecForge's
layout), a DSpark drafter (the demo's DFlash drafter with a random Markov head) and a DFlash2 one (the demo's
drafter with DFlash2's convolutions and a random candidate selector); a model opened without a
drafter is calibrated between plain decoding and n-gram lookup and speculates when n-gram lookup measures faster;
timings fed through the real calibration pick the fastest method and say why the others lost; a method the model
cannot run is refused by name."""
import pytest

from engine.backends.llamacpp import build

try:
    build.find_build()
except build.BuildMissing as exc:
    pytest.skip(f"no llama.cpp build here ({exc})", allow_module_level=True)

from engine.backends import ENGINES  # noqa: E402
from engine.backends.llamacpp import calibrate  # noqa: E402
from engine.backends.llamacpp.engine import load_pair  # noqa: E402
from engine.backends.torch.engine import load_pair as torch_pair  # noqa: E402
from engine.bench import DEMO_DIR  # noqa: E402
from engine.errors import SettingsError  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
# the module's fresh app folder (autouse) and the comparison that allows float-rounding ties
from tests.test_llamacpp_engine import app_home, assert_same_up_to_rounding  # noqa: E402,F401
from tests.tiny_torch import dflash2_from, dspark_from, random_eagle3  # noqa: E402

TARGET, DRAFT = DEMO_DIR / "target", DEMO_DIR / "draft"
# code the demo target continues by repeating itself (a 5.8M model loops): n-gram lookup's best case
REPETITIVE = ("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\nx = 1\n", "#\n#\n#\n#\n#\n#\n#\n#\n",
              "def test_add():\n    assert add(1, 2) == 3\n\n\ndef test_sub():\n    assert sub(3, 2) == 1\n\n\n"
              "def test_mul():\n")
NGRAM = GenerationSettings(max_new_tokens=96, method="ngram", plain_fallback=False)


@pytest.fixture(scope="module")
def target_alone(app_home):
    """The demo target without its drafter, calibrated on code it repeats: n-gram lookup wins by about 2x."""
    saved = calibrate.CODE_PROMPTS
    calibrate.CODE_PROMPTS = REPETITIVE
    try:
        pair = load_pair(TARGET)
    finally:
        calibrate.CODE_PROMPTS = saved
    yield pair
    pair.close()


def test_the_engines_declare_the_methods_they_run():
    assert ENGINES["llamacpp"].methods == ("none", "ngram", "mtp", "eagle3", "dspark", "dflash", "dflash2")
    assert ENGINES["torch"].methods == ("none", "ngram", "eagle3", "dspark", "dflash", "dflash2")
    assert ENGINES["mlx"].methods == ("none", "ngram", "eagle3", "dspark", "dflash", "dflash2")
    for info in ENGINES.values():   # an engine that decodes DFlash2, DSpark or EAGLE-3 drafters says so
        assert ("dflash2" in info.methods) == (2 in info.drafter_generations)
        assert ("dspark" in info.methods) == (3 in info.drafter_generations)
        assert ("eagle3" in info.methods) == (4 in info.drafter_generations)


def test_ngram_lookup_gives_plain_decodings_tokens_on_the_demo_pair(app_home):
    pair, reference = load_pair(TARGET, DRAFT), torch_pair(TARGET)
    try:
        assert pair.info["methods"] == ["none", "ngram", "dflash"]
        drafted = 0
        for text in REPETITIVE:
            ids = pair.tokenizer.encode_prompt(text, raw=True)
            plain = Generation(pair, ids, GenerationSettings(max_new_tokens=96), baseline=True).run()
            fast = Generation(pair, ids, NGRAM).run()
            assert "--spec-type" in pair.server.launch.args(1, DEMO_DIR) and pair.server.launch.method == "ngram"
            assert pair.server.launch.draft is None                  # n-gram lookup needs no drafter
            assert_same_up_to_rounding(fast.tokens, plain.tokens, ids, reference)
            assert fast.stats.accepted <= fast.stats.drafted and fast.stop_reason == "length"
            drafted += fast.stats.accepted
        assert drafted > 0
    finally:
        pair.close()


def test_ngram_lookup_gives_plain_decodings_tokens_on_smollm2(smollm2_folder, unmeasured):
    """A real chat model, in float32 (on Q4_1 a verify's batched products round differently from a plain step's:
    docs/engines/llamacpp.md, "Exactness: up to rounding"), asked to edit text it was given."""
    pair = load_pair(smollm2_folder, dtype="float32")
    try:
        accepted = 0
        for text in calibrate.CHAT_PROMPTS[2:] + ("Repeat this list, one item per line: apples, bread, cheese, "
                                                   "dates, eggs, flour, grapes, honey.",):
            ids = pair.tokenizer.encode_chat([{"role": "user", "content": text}])
            plain = Generation(pair, ids, GenerationSettings(max_new_tokens=96), baseline=True).run()
            fast = Generation(pair, ids, NGRAM).run()
            assert fast.tokens == plain.tokens
            accepted += fast.stats.accepted
        assert accepted > 0
    finally:
        pair.close()


def test_a_model_without_a_drafter_speculates_by_ngram_lookup_where_it_measures_faster(target_alone):
    pair = target_alone
    choice = pair.choice
    assert pair.info["has_drafter"] is False and pair.info["methods"] == ["none", "ngram"]
    assert choice["method"] == "ngram", choice["reason"]
    assert choice["rates"][calibrate.name("ngram", choice["n_max"])] > choice["rates"]["none"]
    assert "n-gram lookup" in choice["reason"] and pair.info["speculation"] == choice
    ids = pair.tokenizer.encode_prompt(REPETITIVE[0], raw=True)
    run = Generation(pair, ids, GenerationSettings(max_new_tokens=64)).run()     # the app's default: its choice
    assert run.stats.drafted > 0 and pair.server.launch.method == "ngram" and run.fallback is None
    plain = Generation(pair, ids, GenerationSettings(max_new_tokens=64), baseline=True).run()
    assert run.tokens == plain.tokens and pair.server.launch.method == "none"


def stub_measure(rates: dict):
    """Timings by setting, fed through the real calibration (servers started, answers not timed)."""
    def measure(server, prompt, n_max, tokens=calibrate.TOKENS):
        launch = server.launch
        setting = calibrate.name(launch.method, n_max) if n_max else "none"
        rate, tau = rates.get(setting, (100.0, 1.5))
        accepted = round(tokens * (1 - 1 / tau))
        return {"tokens": tokens, "seconds": tokens / rate, "drafted": accepted + 1, "accepted": accepted}
    return measure


@pytest.mark.parametrize("rates, method", [
    ({"none": (500.0, 1.0), "ngram 8": (400.0, 2.0)}, "none"),
    ({"none": (500.0, 1.0), "ngram 8": (700.0, 1.8), "ngram 16": (650.0, 2.2)}, ("ngram", 8)),
])
def test_the_calibration_keeps_the_fastest_measured_method_and_says_why(target_alone, monkeypatch, rates, method):
    pair = target_alone
    saved = pair.choice
    monkeypatch.setattr(calibrate, "measure", stub_measure(rates))
    try:
        pair.calibrate(calibrate.choose(pair, force=True))
        choice = pair.choice
        ids = pair.tokenizer.encode_prompt(REPETITIVE[1], raw=True)
        run = Generation(pair, ids, GenerationSettings(max_new_tokens=32)).run()
        if method == "none":
            assert choice["method"] == "none" and "plain decoding (500 tokens/s) was the fastest" in choice["reason"]
            assert "n-gram lookup 400 tokens/s at its best (8 drafts per step, tau 2.00)" in choice["reason"]
            assert pair.server.launch.method == "none" and run.stats.drafted == 0
            assert run.fallback["reason"] == choice["reason"]            # the stats panel says why plain runs
        else:
            assert (choice["method"], choice["n_max"]) == method and "8 drafts per step" in choice["reason"]
            assert pair.server.launch.method == "ngram" and "ngram-mod" in pair.server.launch.args(1, DEMO_DIR)
            assert run.fallback is None
        assert pair.info["method"] == choice["method"] and choice["by_method"]["none"]["tok_s"] == 500.0
    finally:
        pair.calibrate(saved)


def test_a_method_the_model_cannot_run_is_refused_by_name(target_alone):
    ids = target_alone.tokenizer.encode_prompt(REPETITIVE[0], raw=True)
    with pytest.raises(SettingsError, match="runs plain decoding, n-gram lookup, not DFlash"):
        Generation(target_alone, ids, GenerationSettings(method="dflash"))
    with pytest.raises(SettingsError, match="method must be one of"):
        GenerationSettings(method="medusa")
    reference = torch_pair(TARGET, DRAFT)
    with pytest.raises(SettingsError, match="not EAGLE-3"):
        Generation(reference, ids, GenerationSettings(method="eagle3"))
    plain = Generation(reference, ids, GenerationSettings(max_new_tokens=8, method="none")).run()
    assert plain.stats.block_size == 1 and plain.stats.drafted == 0


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    """A tiny random Qwen3.5 (Gated DeltaNet and full attention layers, steered as the architecture tests steer
    it) with a multi-token-prediction head as Qwen ships one: mtp.* tensors, here a copy of its last full
    attention layer with random projections, and `mtp_num_hidden_layers` in its config."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    from tests.test_llamacpp_architectures import tiny_pair
    root = tmp_path_factory.mktemp("mtp")
    target, _, _ = tiny_pair(root, "qwen3_5")
    reference = torch_pair(target)           # the same weights without the head: what plain decoding gives
    weights = load_file(target / "model.safetensors")
    hidden = weights["model.embed_tokens.weight"].shape[1]
    g = torch.Generator().manual_seed(5)
    layer = "model.layers.3."                # a full attention layer (they alternate, from the second)
    weights.update({"mtp.layers.0." + k[len(layer):]: v.clone() for k, v in weights.items() if k.startswith(layer)})
    weights.update({"mtp.fc.weight": torch.randn(hidden, 2 * hidden, generator=g) * 0.05,
                    **{f"mtp.{n}.weight": torch.ones(hidden) for n in
                       ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}})
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((target / "config.json").read_text(encoding="utf-8"))
    (target / "config.json").write_text(json.dumps({**cfg, "mtp_num_hidden_layers": 1}), encoding="utf-8")
    return target, reference


def test_a_targets_own_mtp_head_drafts_and_gives_plain_decodings_tokens(mtp_target):
    target, reference = mtp_target
    pair = load_pair(target, dtype="float32")
    try:
        assert pair.info["methods"] == ["none", "ngram", "mtp"] and "mtp" in pair.choice["by_method"]
        drafted, _ = mtp_against_plain(pair, reference, None, "MTP")
        assert drafted > 0
    finally:
        pair.close()


def mtp_against_plain(pair, reference, draft, what: str) -> tuple[int, int]:
    """Greedy MTP at 1 and 3 drafts on every prompt gives plain decoding's tokens (ties excepted), on a server
    started with `--spec-type draft-mtp` and the drafter `draft` (None: the target's own head); returns the drafts
    proposed and accepted over all of them."""
    from tests.test_llamacpp_architectures import PROMPTS
    from tests.test_llamacpp_architectures import assert_same_up_to_rounding as same
    drafted = accepted = 0
    for prompt in PROMPTS:
        plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=32), baseline=True).run()
        for n in (1, 3):
            fast = Generation(pair, prompt, GenerationSettings(max_new_tokens=32, method="mtp", block_size=n + 1,
                                                               plain_fallback=False)).run()
            launch = pair.server.launch
            assert (launch.method, launch.n_max, launch.draft) == ("mtp", n, draft)
            args = launch.args(1, DEMO_DIR)
            assert args[args.index("--spec-type") + 1] == "draft-mtp"
            assert (args[args.index("-md") + 1] if "-md" in args else None) == (str(draft) if draft else None)
            same(fast.tokens, plain.tokens, prompt, reference, f"{what} with {n} drafts against plain llama.cpp")
            drafted, accepted = drafted + fast.stats.drafted, accepted + fast.stats.accepted
    return drafted, accepted


def test_an_eagle3_drafter_converts_pairs_and_gives_plain_decodings_tokens(app_home, tmp_path):
    """An EAGLE-3 drafter (random, for the demo target) converts with llama.cpp's converter, pairs by its
    metadata, runs as draft-eagle3 and keeps plain decoding's greedy tokens; one made for another target's
    layers is refused before a server starts."""
    import json

    from engine.errors import PairMismatchError
    reference = torch_pair(TARGET)
    cfg = json.loads((TARGET / "config.json").read_text(encoding="utf-8"))
    drafter = random_eagle3(tmp_path / "eagle3", cfg, layers=[1, 3, 5])
    pair = load_pair(TARGET, drafter)
    try:
        assert pair.info["methods"] == ["none", "ngram", "eagle3"] and pair.info["has_drafter"]
        assert set(pair.choice["by_method"]) == {"none", "ngram", "eagle3"}
        drafted = 0
        for text in REPETITIVE[:2]:
            ids = pair.tokenizer.encode_prompt(text, raw=True)
            plain = Generation(pair, ids, GenerationSettings(max_new_tokens=48), baseline=True).run()
            fast = Generation(pair, ids, GenerationSettings(max_new_tokens=48, method="eagle3", block_size=4,
                                                            plain_fallback=False)).run()
            launch = pair.server.launch
            assert (launch.method, launch.n_max) == ("eagle3", 3) and launch.draft is not None
            assert "draft-eagle3" in launch.args(1, DEMO_DIR)
            assert_same_up_to_rounding(fast.tokens, plain.tokens, ids, reference)
            drafted += fast.stats.drafted
        assert drafted > 0
    finally:
        pair.close()
    wrong = random_eagle3(tmp_path / "wrong", cfg, layers=[1, 3, 9])
    with pytest.raises(PairMismatchError, match="reads target layers"):
        load_pair(TARGET, wrong)


def test_specforges_nested_layer_ids_reach_llamacpps_converter_as_the_torch_engine_reads_them(app_home, tmp_path):
    """llama.cpp's converter reads only top-level ids (inputs of layers); SpecForge nests its ids (outputs): the GGUF
    holds the same layers the torch engine reads (each + 1), not llama.cpp's default; top-level ids pass as they are."""
    import json

    from engine.backends.llamacpp.convert import draft_gguf
    from engine.config import DraftConfig
    from engine.gguf_metadata import read_metadata
    cfg = json.loads((TARGET / "config.json").read_text(encoding="utf-8"))
    for name, layers, extra, inputs in (("nested", None, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}},
                                         [1, 3, 4]), ("top", [1, 3, 5], {}, [1, 3, 5])):
        drafter = random_eagle3(tmp_path / name, cfg, layers=layers, **extra)
        assert [i + 1 for i in DraftConfig.from_file(drafter / "config.json").capture_layers(6)] == inputs
        assert read_metadata(draft_gguf(drafter, TARGET))["eagle3.target_layers"] == inputs


def test_a_dspark_drafter_converts_pairs_and_gives_plain_decodings_tokens(app_home, tmp_path):
    """A DSpark drafter (DeepSpec's layout) converts with llama.cpp's converter, is told from a DFlash one by its
    Markov head, drafts its whole block from the last token as draft-dspark, and keeps plain decoding's greedy
    tokens; one in speculators' layout drafts a block after the last token, as DFlash does; one made for another
    target's layers is refused before a server starts."""
    from engine import gguf_metadata as metadata
    from engine.backends.llamacpp import convert
    from engine.backends.llamacpp.engine import drafter_block
    from engine.errors import PairMismatchError
    reference = torch_pair(TARGET)
    pair = load_pair(TARGET, dspark_from(DRAFT, tmp_path / "dspark"))
    try:
        assert pair.info["methods"] == ["none", "ngram", "dspark"] and pair.info["has_drafter"]
        assert set(pair.choice["by_method"]) == {"none", "ngram", "dspark"}
        assert pair.block_size == 17                  # 16 drafts from a block of 16, then the target's token
        drafted = accepted = 0
        for text in REPETITIVE[:2]:
            ids = pair.tokenizer.encode_prompt(text, raw=True)
            plain = Generation(pair, ids, GenerationSettings(max_new_tokens=48), baseline=True).run()
            for n in (3, 16):
                fast = Generation(pair, ids, GenerationSettings(max_new_tokens=48, method="dspark", block_size=n + 1,
                                                                plain_fallback=False)).run()
                launch = pair.server.launch
                assert (launch.method, launch.n_max) == ("dspark", n) and launch.draft is not None
                assert "draft-dspark" in launch.args(1, DEMO_DIR)
                assert_same_up_to_rounding(fast.tokens, plain.tokens, ids, reference)
                drafted, accepted = drafted + fast.stats.drafted, accepted + fast.stats.accepted
        assert drafted > 0 and accepted > 0
    finally:
        pair.close()
    meta = metadata.read_metadata(convert.draft_gguf(dspark_from(DRAFT, tmp_path / "speculators", speculators=True),
                                                     TARGET), tensors=True)
    assert metadata.drafter_method(meta) == "dspark" and meta["dflash.target_layers"] == [2, 3, 4]
    assert meta["dflash.sample_from_anchor"] is False and drafter_block(meta) == 16
    with pytest.raises(PairMismatchError, match="reads target layers"):
        load_pair(TARGET, dspark_from(DRAFT, tmp_path / "wrong", layers=(1, 2, 9)))


def test_a_dflash2_drafter_converts_drafts_and_gives_plain_decodings_tokens(tmp_path, monkeypatch):
    """A DFlash2 drafter (z-lab's format) converts with llama.cpp's converter, is told from a DFlash one by its
    candidate selector, calibrates and drafts as DFlash2 (llama-server's draft-dflash, which walks the selector's
    lattice): a fresh one drafts and keeps exactly what its DFlash base does, so the convolutions and the
    selector are wired through; one with a trained-looking selector keeps other drafts, and greedy output stays
    plain decoding's. Calibration runs its real code path on stub timings (servers started, answers untimed)."""
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))   # stub choices stay in this test
    monkeypatch.setattr(calibrate, "measure", stub_measure({"none": (100.0, 1.0), "dflash2 7": (300.0, 3.0)}))
    reference = torch_pair(TARGET)
    fresh = load_pair(TARGET, dflash2_from(DRAFT, tmp_path / "fresh", 0.0))
    base = load_pair(TARGET, DRAFT, draft_vocab=0)     # drafting from every token, as DFlash2 does
    trained = load_pair(TARGET, dflash2_from(DRAFT, tmp_path / "trained", 0.05))
    try:
        assert fresh.info["methods"] == ["none", "ngram", "dflash2"] and fresh.info["drafter_generation"] == 2
        assert base.info["drafter_generation"] == 1 and fresh.draft_vocab is None   # its ranking unused
        assert (tmp_path / "fresh" / "draft_vocab.json").is_file()
        assert (fresh.choice["method"], fresh.choice["n_max"]) == ("dflash2", 7)
        assert "llama.cpp's DFlash2 with 7 drafts per step" in fresh.choice["reason"]
        kept = {"base": 0, "trained": 0}
        for text in REPETITIVE[1:] + ("import os\n\ndef list_files(path):\n",):
            ids = fresh.tokenizer.encode_prompt(text, raw=True)
            plain = Generation(fresh, ids, GenerationSettings(max_new_tokens=48), baseline=True).run()
            for n in (3, 15):
                def run(pair, method):
                    return Generation(pair, ids, GenerationSettings(max_new_tokens=48, method=method, block_size=n + 1,
                                                                    plain_fallback=False)).run()
                mine, theirs, other = run(fresh, "dflash2"), run(base, "dflash"), run(trained, "dflash2")
                assert (fresh.server.launch.method, fresh.server.launch.n_max) == ("dflash2", n)
                assert "draft-dflash" in fresh.server.launch.args(1, DEMO_DIR) and mine.stats.speculation == "dflash2"
                assert (mine.tokens, mine.stats.drafted, mine.stats.accepted) == (
                    theirs.tokens, theirs.stats.drafted, theirs.stats.accepted)
                for run_ in (mine, other):
                    assert_same_up_to_rounding(run_.tokens, plain.tokens, ids, reference)
                kept["base"] += theirs.stats.accepted
                kept["trained"] += other.stats.accepted
        assert kept["base"] > 0 and kept["trained"] > 0 and kept["trained"] != kept["base"]
        # where plain decoding measured fastest, an answer asking for a block size drafts with the drafter, and
        # its stats name DFlash2, not the engine's choice (plain) nor DFlash
        monkeypatch.setattr(calibrate, "measure", stub_measure({"none": (500.0, 1.0)}))
        trained.calibrate(calibrate.choose(trained, force=True))
        assert trained.choice["method"] == "none"
        run = Generation(trained, ids, GenerationSettings(max_new_tokens=16, block_size=4, plain_fallback=False)).run()
        assert run.stats.speculation == "dflash2" and run.stats.drafted > 0
    finally:
        for pair in (fresh, base, trained):
            pair.close()


def random_assistant(folder, target, hidden: int = 32, backbone: int | None = None, vocab: int | None = None,
                     seed: int = 3):
    """A random Gemma 4 assistant (Gemma4AssistantForCausalLM, as google/gemma-4-*-it-assistant ship it: every
    layer reading the target's keys and values, ordered embeddings with centroids) for a tiny Gemma 4 target:
    its head sizes and layer kinds the target's, and its hidden size, as it must be, another. Its last layer is
    steered to draft STEERED at every step: one FFN unit gelu(z) * z (never negative) written to one channel, which
    alone reaches the output norm and the STEERED row of the (tied) head; the target writes STEERED where its own
    state leans that way (the architecture tests' steering), so some drafts are accepted and some not."""
    import json

    import torch
    import transformers as tf
    from safetensors.torch import load_file, save_file
    from transformers.models.gemma4 import configuration_gemma4

    from tests.test_llamacpp_architectures import STEERED
    t = json.loads((target / "config.json").read_text(encoding="utf-8"))
    text = tf.Gemma4TextConfig(
        vocab_size=vocab or t["vocab_size"], hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
        global_head_dim=t["per_layer_config"][str(t["layer_types"].index("full_attention"))]["head_dim"],
        layer_types=["sliding_attention", "full_attention"], sliding_window=t["sliding_window"],
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, pad_token_id=0,
        max_position_embeddings=t["max_position_embeddings"])
    cfg = tf.Gemma4AssistantConfig(text_config=text.to_dict(), backbone_hidden_size=backbone or t["hidden_size"],
                                   use_ordered_embeddings=True, num_centroids=64, centroid_intermediate_top_k=8)
    torch.manual_seed(seed)
    with pytest.MonkeyPatch.context() as mp:
        # transformers 5.23's Gemma4TextConfig.kv_sharing_modes refuses a model whose every layer shares (it wants
        # a layer of each kind that stores), which is what an assistant is: its layers all read the target's
        mp.setattr(configuration_gemma4.Gemma4TextConfig, "kv_sharing_modes",
                   property(lambda c: ["reuse"] * c.num_hidden_layers))
        tf.Gemma4AssistantForCausalLM(cfg).save_pretrained(folder)
    path = folder / "model.safetensors"
    weights, layer, d = load_file(path), "model.layers.1.", 0
    g = torch.randn(hidden, generator=torch.Generator().manual_seed(seed))
    for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        weights[f"{layer}{name}.weight"].zero_()
    weights[f"{layer}mlp.gate_proj.weight"][0] = g
    weights[f"{layer}mlp.up_proj.weight"][0] = g
    weights[f"{layer}mlp.down_proj.weight"][d, 0] = 1.0
    weights[f"{layer}post_feedforward_layernorm.weight"][d] = 1000.0
    weights["model.norm.weight"].zero_()[d] = 1.0
    weights["model.embed_tokens.weight"].zero_()[STEERED, d] = 10.0
    save_file(weights, path, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def gemma4_target(tmp_path_factory):
    """A tiny random Gemma 4 (sliding and full attention, shared KV layers, per-layer embeddings) steered as the
    architecture tests steer it, and the torch engine on the same weights."""
    from tests.test_llamacpp_architectures import tiny_pair
    target, _, _ = tiny_pair(tmp_path_factory.mktemp("gemma4"), "gemma4")
    return target, torch_pair(target)


def test_a_gemma4_assistant_drafts_as_mtp_and_gives_plain_decodings_tokens(gemma4_target, tmp_path):
    """Gemma 4's MTP drafter, a separate assistant checkpoint, converts with the target's tokenizer to a
    gemma4-assistant GGUF, pairs by its metadata, runs as -md ... --spec-type draft-mtp (it shares the target's
    keys and values) and keeps plain decoding's greedy tokens at 1 and 3 drafts, through steps that accept some."""
    from engine import gguf_metadata as metadata
    target, reference = gemma4_target
    pair = load_pair(target, random_assistant(tmp_path / "assistant", target), dtype="float32")
    try:
        assert pair.info["methods"] == ["none", "ngram", "mtp"] and pair.info["has_drafter"]
        assert metadata.architecture(metadata.read_metadata(pair.draft)) == "gemma4-assistant"
        assert set(pair.choice["by_method"]) == {"none", "ngram", "mtp"}
        assert pair.block_size == calibrate.MTP_CANDIDATES[-1] + 1
        drafted, accepted = mtp_against_plain(pair, reference, pair.draft, "Gemma 4 assistant")
        assert drafted > 0 and 0 < accepted < drafted
    finally:
        pair.close()


@pytest.mark.parametrize("change, problem", [({"backbone": 48}, "hidden size 48"),
                                             ({"vocab": 4096}, "vocabulary 4096")])
def test_an_assistant_for_another_model_is_refused_by_name(gemma4_target, tmp_path, change, problem):
    """Before converting: an assistant made for a target of another hidden size or vocabulary; after: its GGUF,
    converted regardless, refused by its header before a server starts; and any assistant beside a target that
    is not Gemma 4."""
    from engine.backends.llamacpp import convert
    from engine.errors import PairMismatchError
    target, _ = gemma4_target
    wrong = random_assistant(tmp_path / "wrong", target, **change)
    with pytest.raises(PairMismatchError, match=f"assistant for a model of {problem}, but target has"):
        load_pair(target, wrong, dtype="float32")
    gguf = convert.convert(wrong, tmp_path / "wrong.gguf", "f32", None, "a wrong assistant", lambda: False,
                           tokenizer=target)
    if "backbone" in change:             # the vocabulary is the target's tokenizer's: only the hidden size shows
        with pytest.raises(PairMismatchError, match="has hidden size 48 but .* has 64: this drafter was made for"):
            load_pair(target, gguf, dtype="float32")
    else:
        with pytest.raises(PairMismatchError, match="drafts for a Gemma 4 model only"):
            load_pair(TARGET, gguf)
