"""The llama.cpp engine's checks that need no build: GGUF headers (written here byte by byte), the pair
check that runs before any server starts, and the calibration's decision."""
import struct

import pytest

from engine import gguf_metadata as metadata
from engine.backends.llamacpp import calibrate
from engine.errors import CheckpointError, PairMismatchError


def gguf(path, kv: dict, tensors: int = 3):
    """A GGUF v3 header with these keys (ints as uint32, lists of ints as uint32 arrays, str as strings)."""
    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kv))
    for k, v in kv.items():
        out += string(k)
        if isinstance(v, str):
            out += struct.pack("<I", 8) + string(v)
        elif isinstance(v, list) and v and isinstance(v[0], str):
            out += struct.pack("<IIQ", 9, 8, len(v)) + b"".join(string(x) for x in v)
        elif isinstance(v, list):
            out += struct.pack("<IIQ", 9, 4, len(v)) + b"".join(struct.pack("<I", x) for x in v)
        else:
            out += struct.pack("<II", 4, v)
    path.write_bytes(out + b"\0" * 64)
    return path


def target(tmp_path, layers=6, hidden=256, vocab=8):
    return gguf(tmp_path / "t.gguf", {"general.architecture": "qwen3", "qwen3.block_count": layers,
                                      "qwen3.embedding_length": hidden, "tokenizer.ggml.tokens": ["a"] * vocab})


def draft(tmp_path, layers=(2, 3, 4), hidden=256, vocab=8, arch="dflash"):
    return gguf(tmp_path / "d.gguf", {"general.architecture": arch, "dflash.target_layers": list(layers),
                                      "dflash.embedding_length": hidden, "dflash.block_size": 16,
                                      "tokenizer.ggml.tokens": ["a"] * vocab})


def test_metadata_reads_keys_and_refuses_what_is_not_gguf(tmp_path):
    meta = metadata.read_metadata(draft(tmp_path))
    assert meta["dflash.target_layers"] == [2, 3, 4] and meta["dflash.block_size"] == 16
    assert metadata.vocab_size(meta) == 8 and meta["gguf.tensor_count"] == 3
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"\x89PNG\r\n" + b"0" * 100)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        metadata.read_metadata(bad)
    cut = draft(tmp_path).read_bytes()[:40]
    bad.write_bytes(cut)
    with pytest.raises(CheckpointError, match="truncated"):
        metadata.read_metadata(bad)
    huge = bytearray(draft(tmp_path).read_bytes())
    huge[24:32] = struct.pack("<Q", 1 << 60)          # the first key's length
    bad.write_bytes(bytes(huge))
    with pytest.raises(CheckpointError, match="damaged header"):
        metadata.read_metadata(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        metadata.read_metadata(tmp_path / "missing.gguf")


@pytest.mark.parametrize("change, message", [
    (dict(layers=(2, 4, 6)), "cannot export its last one"),        # layer 5 of 6: the last
    (dict(hidden=128), "hidden size 128 but t.gguf has 256"),
    (dict(vocab=9), "vocabulary 9 but t.gguf has 8"),
    (dict(arch="qwen3"), "is not a DFlash or EAGLE-3 drafter"),
])
def test_a_drafter_that_does_not_fit_its_target_is_refused_by_name(tmp_path, change, message):
    t = metadata.read_metadata(target(tmp_path))
    d = metadata.read_metadata(draft(tmp_path, **change))
    with pytest.raises(PairMismatchError, match=message):
        metadata.check_pair(t, d, "t.gguf", "d.gguf")


@pytest.mark.parametrize("settings, message", [
    (dict(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=8), None),   # 256 = 16 x 16
    (dict(conv_kernel_size=2, conv_group_size=16, selector_rank=16), "without dflash.selector_top_k"),
    (dict(conv_kernel_size=2, conv_group_size=48, selector_rank=16, selector_top_k=8), "multiple of its convolution"),
    (dict(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=16), "at least top-k x"),
])
def test_a_dflash2_drafter_llamacpp_cannot_run_is_refused_by_name(tmp_path, settings, message):
    """llama.cpp's DFlash2 graph refuses a drafter whose settings are missing, whose hidden size its convolution
    groups do not divide, or too narrow for the selector's lattice (256 < 16 x 17): said before a server starts."""
    t = metadata.read_metadata(target(tmp_path))
    d = {**metadata.read_metadata(draft(tmp_path)), **{f"dflash.{k}": v for k, v in settings.items()}}
    if message is None:
        metadata.check_pair(t, d, "t.gguf", "d.gguf")
    else:
        with pytest.raises(CheckpointError, match=message):
            metadata.check_pair(t, d, "t.gguf", "d.gguf")


def test_a_fitting_pair_passes_and_swapped_files_are_named(tmp_path):
    t, d = metadata.read_metadata(target(tmp_path)), metadata.read_metadata(draft(tmp_path))
    metadata.check_pair(t, d, "t.gguf", "d.gguf")
    with pytest.raises(PairMismatchError, match="Swap the two files"):
        metadata.check_pair(d, t, "d.gguf", "t.gguf")


def test_the_calibration_picks_the_fastest_and_says_why():
    dflash = calibrate.decide({"none": {"tok_s": 100.0, "tau": 1.0}, "dflash 3": {"tok_s": 150.0, "tau": 3.0},
                               "dflash 7": {"tok_s": 180.0, "tau": 4.5}, "dflash 15": {"tok_s": 170.0, "tau": 5.0},
                               "ngram 8": {"tok_s": 120.0, "tau": 1.5}})
    assert (dflash["method"], dflash["n_max"]) == ("dflash", 7) and dflash["speed_share"] == 1.8
    assert "DFlash with 7 drafts per step" in dflash["reason"]
    assert "n-gram lookup 120 tokens/s at its best (8 drafts per step, tau 1.50)" in dflash["reason"]
    assert dflash["by_method"] == {"none": {"n_max": 0, "tok_s": 100.0, "tau": 1.0},
                                   "dflash": {"n_max": 7, "tok_s": 180.0, "tau": 4.5},
                                   "ngram": {"n_max": 8, "tok_s": 120.0, "tau": 1.5}}
    ngram = calibrate.decide({"none": {"tok_s": 100.0, "tau": 1.0}, "ngram 16": {"tok_s": 130.0, "tau": 2.0},
                              "mtp 2": {"tok_s": 110.0, "tau": 1.8}})
    assert (ngram["method"], ngram["n_max"]) == ("ngram", 16) and "MTP heads 110 tokens/s" in ngram["reason"]
    plain = calibrate.decide({"none": {"tok_s": 1000.0, "tau": 1.0}, "dflash 7": {"tok_s": 800.0, "tau": 4.0}})
    assert plain["method"] == "none" and plain["n_max"] == 0 and "plain decoding" in plain["reason"]
    assert "800" in plain["reason"]
