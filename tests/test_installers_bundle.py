"""The bundle's trim rules (installers/bundle.py), checked without a build so the regular suite guards
them; tests/test_installers_linux.py checks the built bundle itself."""
from __future__ import annotations

from pathlib import Path

import transformers

from engine.backends import ENGINES
from installers import bundle

MODELS = Path(transformers.__file__).parent / "models"
ARCHITECTURES = {a for info in ENGINES.values() for a in info.architectures}


def test_what_the_app_runs_is_kept():
    for dest in ("torch/bin/torch_shm_manager", "torch/lib/libtorch_cpu.so", "torch/lib/torch_cpu.dll",
                 "PySide6/Qt/plugins/platforms/libqxcb.so", "PySide6/Qt/plugins/platforms/qwindows.dll",
                 "PySide6/Qt/plugins/iconengines/libqsvgicon.so", "PySide6/Qt/lib/libQt6Gui.so.6",
                 "assets/demo/target/model.safetensors"):
        assert not bundle.dropped(dest), dest


def test_tests_translations_and_host_leaks_are_dropped():
    for dest in ("torch/test/test_api", "torch/bin/test_api", "torch/include/ATen/ATen.h",
                 "torch/lib/libtorchbind_test.so", "PySide6/Qt/translations/qtbase_de.qm",
                 "PySide6/Qt/plugins/platformthemes/libqgtk3.so", "PySide6/Qt/plugins/imageformats/libqpdf.so",
                 "libgtk-3.so.0", "libcudart.so.12", "nvidia/cublas/lib/libcublas.so.12", "cudart64_12.dll",
                 "torch\\lib\\cudnn64_9.dll"):
        assert bundle.dropped(dest), dest


def test_model_code_of_every_claimed_family_is_kept():
    excluded = set(bundle.transformers_excludes(MODELS, ARCHITECTURES))
    for family in ARCHITECTURES | {"auto", "encoder_decoder"}:
        modules = {f"transformers.models.{family}.{f.stem}" for f in (MODELS / family).glob("*.py")
                   if not f.stem.startswith("modular_")}
        assert modules and not modules & excluded, family
    assert "transformers.models.bert.modeling_bert" in excluded
    assert "transformers.models.bert.tokenization_bert" not in excluded, "any family's tokenizer may be named"


def test_mlx_only_in_the_macos_bundle():
    assert "mlx" in bundle.excludes("linux") and "mlx" in bundle.excludes("win32")
    assert "mlx" not in bundle.excludes("darwin")
