"""bench/bench_cuda_steps.py runs end to end on the CPU with the tiny shapes, so the script a GPU session
runs in one call is known to work before that session (its timings are not judged here)."""
import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_cuda_steps.py"


def test_the_cuda_step_benchmark_reports_every_variant_and_eta(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_cuda_steps", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "steps.json"
    report = bench.main(["--shape", "tiny-qwen3", "tiny-qwen3.5", "--device", "cpu", "--steps", "2",
                         "--prompt", "20", "--tokens", "4", "--context", "128", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["environment"]["device"] == "cpu" and report["environment"]["torch"]
    assert set(report["shapes"]) == {"tiny-qwen3", "tiny-qwen3.5"}
    variants = {name: set(shape["costs_ms"]) for name, shape in report["shapes"].items()}
    # graphs and kernels are CUDA-only variants; DenseDecoder takes dense targets only
    assert variants == {"tiny-qwen3": {"eager", "static", "dense"}, "tiny-qwen3.5": {"eager", "static"}}
    for shape in report["shapes"].values():
        for ms in shape["costs_ms"].values():
            assert all(ms[op] > 0 for op in ("plain", "draft", "verify", "commit"))
            assert abs(ms["eta"] - (ms["draft"] + ms["verify"] + ms["commit"]) / ms["plain"]) < 1e-9
        assert shape["plain_tok_s"]["ours"] > 0 and shape["plain_tok_s"]["generate"] > 0
        assert not any(captured for captured, _ in shape["graphs"]["static"].values())   # no graphs on a CPU
