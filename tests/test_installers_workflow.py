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
    """Linux and Windows ship llama.cpp's portable CPU build, Apple Silicon its Metal one; the app build
    must name the same backend (installers/build.py defaults to it where none is named)."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    for name, backend in {"linux": "cpu", "windows": "cpu", "macos": "metal"}.items():
        runs = [step.get("run", "") for step in jobs[name]["steps"]]
        built = [r for r in runs if "engine.backends.llamacpp.build" in r]
        assert built and all(f"--backend {backend} --portable" in r for r in built), (name, built)
        app = [r for r in runs if "installers/build.py" in r]
        assert all("--llamacpp-backend" not in r or f"--llamacpp-backend {backend}" in r for r in app), name
        assert runs.index(built[0]) < min((runs.index(r) for r in app + [r for r in runs if "test_installers_linux" in r])), name
