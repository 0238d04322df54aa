"""The installers workflow cannot run here, so it is checked the two ways that can: against GitHub's
workflow schema (check-jsonschema's vendored copy, no network), and every script or test it calls must
exist, so a renamed script breaks this test instead of a release."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "installers.yml"


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_workflow_matches_githubs_schema():
    result = lint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_can_fail(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-22.04", "run-on: ubuntu-22.04"))
    assert lint(broken).returncode != 0


def test_every_script_the_workflow_calls_exists():
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert set(jobs) == {"linux", "windows", "macos"}
    called = set()
    for job in jobs.values():
        for step in job["steps"]:
            called.update(re.findall(r"(?:installers|tests)/[\w./-]+\.(?:py|sh|ps1)", step.get("run", "")))
        assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in job["steps"])
    assert len(called) >= 10
    missing = sorted(p for p in called if not (ROOT / p).is_file())
    assert not missing, f"the workflow calls scripts that do not exist: {missing}"


def test_each_job_builds_the_llama_cpp_it_ships():
    """Linux and Windows ship llama.cpp's portable CPU and Vulkan builds (the Vulkan SDK installed before),
    Apple Silicon its Metal one; the app build must name the same backends (installers/build.py defaults to
    them where none are named)."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    for name, backends in {"linux": ["cpu", "vulkan"], "windows": ["cpu", "vulkan"], "macos": ["metal"]}.items():
        steps = jobs[name]["steps"]
        runs = [step.get("run", "") for step in steps]
        built = [r for r in runs if "engine.backends.llamacpp.build" in r]
        assert [re.search(r"--backend (\w+) --portable", r)[1] for r in built] == backends, (name, built)
        app = [r for r in runs if "installers/build.py" in r]
        assert all("--llamacpp-backend" not in r or f"--llamacpp-backend {','.join(backends)}" in r for r in app), name
        assert runs.index(built[-1]) < min((runs.index(r) for r in app + [r for r in runs if "test_installers_linux" in r])), name
        if "vulkan" in backends:
            sdk = next(i for i, step in enumerate(steps) if "install-vulkan-sdk" in step.get("uses", ""))
            assert sdk < runs.index(built[0]), name
