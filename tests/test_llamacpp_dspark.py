"""DSpark and DFlash2 drafters told from DFlash ones without a build: a GGUF's tensor names read from its header (written
here byte by byte), a Markov head making a dflash drafter DSpark as llama-server decides it, and each drafter's
most tokens per step as llama-server drafts them (the end-to-end run: tests/test_llamacpp_methods.py)."""
import struct

import pytest

from engine import gguf_metadata as metadata
from engine.backends.llamacpp.engine import drafter_block
from engine.errors import CheckpointError


def _string(s: str) -> bytes:
    return struct.pack("<Q", len(s.encode())) + s.encode()


def gguf(path, kv: dict, tensors: dict):
    """A GGUF v3 header: keys (bool, int as uint32, str) and tensor entries (name -> dimensions), no data."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, v in kv.items():
        out += _string(k) + (struct.pack("<I?", 7, v) if isinstance(v, bool) else
                             struct.pack("<I", 8) + _string(v) if isinstance(v, str) else struct.pack("<II", 4, v))
    for name, dims in tensors.items():
        out += _string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, 0, 0)
    path.write_bytes(out)
    return path


DFLASH = {"blk.0.attn_q.weight": (256, 256), "fc.weight": (768, 256)}
MARKOV = {"markov_w1.weight": (16, 4096), "markov_w2.weight": (16, 4096)}
SELECTOR = {"selector_hidden.weight": (256, 16), "selector_predecessor.weight": (16, 4096),
            "selector_successor.weight": (16, 4096), "blk.0.attn_conv_base.weight": (256, 2, 2)}


@pytest.mark.parametrize("arch, kv, tensors, method, block", [
    ("dflash", {}, DFLASH, "dflash", 16),                                       # block_size - 1 drafts + 1
    ("dflash", {}, {**DFLASH, **MARKOV}, "dspark", 17),                         # llama.cpp's default: from the anchor
    ("dflash", {"dflash.sample_from_anchor": True}, {**DFLASH, **MARKOV}, "dspark", 17),
    ("dflash", {"dflash.sample_from_anchor": False}, {**DFLASH, **MARKOV}, "dspark", 16),   # speculators' layout
    ("dflash", {}, {**DFLASH, **SELECTOR}, "dflash2", 16),                      # DFlash2's candidate selector
    ("eagle3", {}, {"fc.weight": (768, 256)}, "eagle3", 7),                     # its longest calibrated draft + 1
])
def test_a_drafters_method_and_block_come_from_its_header(tmp_path, arch, kv, tensors, method, block):
    path = gguf(tmp_path / "d.gguf", {"general.architecture": arch, "dflash.block_size": 16, **kv}, tensors)
    meta = metadata.read_metadata(path, tensors=True)
    assert meta["gguf.tensors"] == set(tensors) and "gguf.tensors" not in metadata.read_metadata(path)
    assert metadata.drafter_method(meta) == method and drafter_block(meta) == block


def test_a_damaged_tensor_entry_is_refused_by_name(tmp_path):
    path = gguf(tmp_path / "d.gguf", {"general.architecture": "dflash"}, {"markov_w1.weight": (16, 4096)})
    data = bytearray(path.read_bytes())
    at = data.index(b"markov_w1.weight") + len("markov_w1.weight")
    data[at:at + 4] = struct.pack("<I", 99)           # its number of dimensions
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged header"):
        metadata.read_metadata(path, tensors=True)
    path.write_bytes(bytes(data[:at - 4]))            # cut inside its name
    with pytest.raises(CheckpointError, match="truncated"):
        metadata.read_metadata(path, tensors=True)
