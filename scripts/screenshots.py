"""Render the app's main states in a real window into docs/screenshots/*.png.

Run under a virtual X server so real windows (not offscreen surfaces) are composed:
    xvfb-run -a -s "-screen 0 1440x900x24" python scripts/screenshots.py
It drives ui.main_window.MainWindow through its public actions with a real worker: the embedded demo
pair when it is built (assets/demo/draft/model.safetensors), else a random pair made in a subprocess
(the GUI process never imports torch). The app's files go to a throwaway DFLASH_DESKTOP_HOME.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CHAT_PROMPT = "import sys\n\n\ndef main(argv=None):"  # no final newline (see ui/chat_view.CODE_EXAMPLES)


def wait_until(app, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"Timed out after {timeout:.0f} s waiting for {what}")
        app.processEvents()
        time.sleep(0.01)


def settle(app, seconds: float = 0.4) -> None:
    """Let layouts and repaints finish before a grab."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def pick_pair(home: Path):
    from dflash_desktop.pairs import PairRequest
    draft = ROOT / "assets" / "demo" / "draft"
    if (draft / "model.safetensors").is_file():
        return PairRequest("demo", "Demo pair (built in)", str(ROOT / "assets/demo/target"), str(draft))
    code = ("import sys; from tests.tiny_torch import save_random_pair; "
            "t, d = save_random_pair(sys.argv[1], hidden=64, layers=4, block_size=8); print(t); print(d)")
    out = subprocess.run([sys.executable, "-c", code, str(home / "pair")], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    target, draft_dir = out.stdout.split()[-2:]
    return PairRequest("random", "Random test pair", target, draft_dir)


def start_long_answer(app, window, prompt: str) -> None:
    """Send a prompt that runs long and return once its first tokens arrived (to break the engine mid-answer)."""
    window.settings.max_new_tokens = 2000
    window.chat_view.input.setPlainText(prompt)
    window.chat_view.submit()
    chunks: list[dict] = []
    window.worker.tokens.connect(chunks.append)
    wait_until(app, lambda: len(chunks) >= 3, 120, "the answer to start")


def shrink(path: Path) -> None:
    """A palette of 256 colours where pngquant is installed (Debian's `pngquant`): a third of the size, no visible
    change. The working tree travels whole to a lent GPU machine (64 MiB with the wheels it carries)."""
    if shutil.which("pngquant"):
        subprocess.run(["pngquant", "--quality", "85-98", "--speed", "1", "--force", "--skip-if-larger",
                        "--ext", ".png", str(path)], check=False)


class Shooter:
    def __init__(self, app, window, out: Path):
        self.app, self.window, self.out = app, window, out
        self.saved: list[Path] = []

    def shoot(self, name: str, widget=None) -> None:
        """Grab the screen area of a real window (the main window unless another is given)."""
        settle(self.app)
        widget = widget or self.window
        geo = widget.frameGeometry()
        screen = widget.screen()
        pixmap = screen.grabWindow(0, geo.x(), geo.y(), geo.width(), geo.height())
        path = self.out / f"{name}.png"
        pixmap.save(str(path), "PNG", 0)
        shrink(path)
        self.saved.append(path)
        print(f"{path}  {path.stat().st_size // 1024} KB", flush=True)


def shoot_picker_on(app, window, shots: Shooter, probe: dict, pair_id: str, name: str, method: str | None = None
                    ) -> None:
    """The model picker on a recorded computer (a HardwareProbe's fields), one pair selected (with one of its ways
    to speculate, when named)."""
    from dflash_desktop.catalog import bundled_path, load_file
    from dflash_desktop.hardware import HardwareProbe, detect
    from ui.model_picker import ModelPicker
    from ui.pair_list_model import Roles
    picker = ModelPicker(window, catalog=load_file(bundled_path()), hardware=detect(HardwareProbe.from_dict(probe)))
    ready: list[bool] = []
    picker.ready.connect(lambda: ready.append(True))
    picker.show()
    wait_until(app, lambda: bool(ready), 60, "the model picker to scan")
    row = next(i for i in range(picker.model.rowCount()) if picker.model.index(i).data(Roles.Id) == pair_id)
    picker.list.setCurrentIndex(picker.model.index(row))
    if method:
        picker.method_box.activated.emit(next(i for i in range(picker.method_box.count())
                                              if picker.method_box.itemData(i) == method))
        settle(app, 0.3)
    shots.shoot(name, picker)
    picker.reject()


def fixture(name: str) -> dict:
    import json
    return json.loads((ROOT / "tests" / "fixtures" / "hardware" / f"{name}.json").read_text())


def shoot_picker_on_a_12gb_gpu(app, window, shots: Shooter) -> None:
    """17: the model picker on a recorded 12 GB NVIDIA card (tests/fixtures/hardware), Qwen3 8B selected:
    full precision leaves no room for DFlash there, so it is planned quantized by bitsandbytes."""
    shoot_picker_on(app, window, shots, fixture("nvidia_rtx3060_smi"), "qwen3-8b", "17-model-picker-12gb-gpu")


def shoot_picker_on_a_vulkan_gpu(app, window, shots: Shooter) -> None:
    """28: the model picker on an 8 GB AMD card seen through llama.cpp's Vulkan build (the recorded AMD fixture with
    an 8 GB card's memory), Qwen3 8B selected: its 8-bit GGUF and drafter do not fit whole, so llama.cpp keeps
    part of the layers on the GPU and the rest on the CPU, and the picker says how many."""
    probe = fixture("amd_rx7800xt_vulkan")
    probe["llama_devices"]["output"] = (
        "Available devices:\n  Vulkan0: AMD Radeon RX 7600 (RADV NAVI33) (8176 MiB, 7450 MiB free)\n")
    shoot_picker_on(app, window, shots, probe, "qwen3-8b", "28-model-picker-vulkan-gpu")


def shoot_picker_choosing_llamacpp_on_nvidia(app, window, shots: Shooter) -> None:
    """29: the model picker on an 8 GB NVIDIA card that llama.cpp's Vulkan build also lists (a fixture), Qwen3 4B
    selected: PyTorch would have to quantize it to NF4 while loading, llama.cpp's Q4_K_M GGUF fits whole, so the
    plan is llama.cpp and the fit line says why."""
    shoot_picker_on(app, window, shots, fixture("nvidia_rtx4060_vulkan"), "qwen3-4b", "29-model-picker-nvidia-llamacpp")


def shoot_picker_dflash2_in_llamacpp(app, window, shots: Shooter) -> None:
    """31: the model picker on a 16 GB AMD card through llama.cpp's Vulkan build (a fixture), Qwen3.8 27B selected
    with z-lab's DFlash2 drafter: every engine runs it now, and llama.cpp plans its 4-bit GGUF with part of the
    layers on the GPU."""
    shoot_picker_on(app, window, shots, fixture("amd_rx7800xt_vulkan"), "qwen3.8-27b",
                    "31-model-picker-dflash2-llamacpp")


def shoot_picker_dspark_in_torch(app, window, shots: Shooter) -> None:
    """33: the model picker on a recorded 24 GB NVIDIA card, Qwen3 4B with DeepSeek's DSpark drafter chosen: MLX,
    llama.cpp and PyTorch all run DSpark drafters now, and PyTorch runs the pair on the card."""
    shoot_picker_on(app, window, shots, fixture("nvidia_rtx4090_nvml"), "qwen3-4b", "33-model-picker-dspark-torch",
                    method="dspark")


def shoot_picker_eagle3_in_torch(app, window, shots: Shooter) -> None:
    """34: the model picker on a recorded 24 GB NVIDIA card, Qwen3 4B with AngelSlim's EAGLE-3 drafter chosen: every
    engine runs SpecForge's EAGLE-3 layout now, and PyTorch runs the pair on the card."""
    shoot_picker_on(app, window, shots, fixture("nvidia_rtx4090_nvml"), "qwen3-4b", "34-model-picker-eagle3-torch",
                    method="eagle3")


def shoot_picker_choices(app, window, shots: Shooter) -> None:
    """26-27: the model picker on this computer after the chat pair loaded. 26: Qwen3 4B with the speculation box
    open, its EAGLE-3 drafter chosen (size, fit and plan follow the choice); 27: the chat pair, with what its
    calibration measured fastest when it loaded."""
    from dflash_desktop.catalog import bundled_path, load_file
    from ui.model_picker import ModelPicker
    from ui.pair_list_model import Roles
    picker = ModelPicker(window, catalog=load_file(bundled_path()), measured=window.settings.measured)
    ready: list[bool] = []
    picker.ready.connect(lambda: ready.append(True))
    picker.show()
    wait_until(app, lambda: bool(ready), 60, "the model picker to scan")

    def select(pair_id: str) -> None:
        row = next(i for i in range(picker.model.rowCount()) if picker.model.index(i).data(Roles.Id) == pair_id)
        picker.list.setCurrentIndex(picker.model.index(row))
    select("qwen3-4b")
    picker.method_box.activated.emit(next(i for i in range(picker.method_box.count())
                                          if picker.method_box.itemData(i) == "eagle3"))
    picker.method_box.showPopup()
    settle(app, 0.4)
    shots.shoot("26-model-picker-speculation", picker)
    picker.method_box.hidePopup()
    select("chat")
    settle(app, 0.2)
    shots.shoot("27-model-picker-measured", picker)
    picker.reject()


def new_chat(window) -> list[dict]:
    """A new chat with room for 160 tokens; the list fills with each answer's finished event."""
    finished: list[dict] = []
    window.controller.answerFinished.connect(finished.append)
    window.settings.max_new_tokens = 160
    window.controller.new_chat()
    return finished


def answer_and_shoot(app, window, shots: Shooter, name: str, question: str, pair,
                     ready_name: str | None = None) -> None:
    """Load the pair in a new chat (shot as `ready_name` once ready), ask, and shoot the answer with the stats
    panel."""
    from dflash_desktop.pairs import PairRequest
    pair, finished = PairRequest.of(pair), new_chat(window)
    window.load_pair(pair)
    wait_until(app, lambda: window.session.ready, 300, f"{pair.name} to load")
    if ready_name:
        window.show_stats(False)
        shots.shoot(ready_name)
    window.chat_view.input.setPlainText(question)
    window.chat_view.submit()
    wait_until(app, lambda: bool(finished), 240, f"{pair.name}'s answer")
    window.show_stats(True)
    shots.shoot(name)


def shoot_trust_states(app, window, shots: Shooter, home: Path) -> None:
    """22-24 on the code pair: an answer the loop guard ended (this chat's repeat penalty off), a failed load that
    kept the working model, and the speedup demo declining a headline while other programs load the CPU."""
    c = window.controller
    finished = new_chat(window)
    c.set_chat_overrides({"repeat_penalty": 1.0})
    window.chat_view.input.setPlainText('class Counter:\n    """Count how often each item was seen."""\n\n'
                                        "    def __init__(self):")
    window.chat_view.submit()
    wait_until(app, lambda: bool(finished), 240, "the looping answer")
    window.show_stats(True)
    shots.shoot("22-loop-guard")
    window.show_stats(False)

    not_a_model = home / "Not a model"
    not_a_model.mkdir(exist_ok=True)
    (not_a_model / "notes.txt").write_text("shopping list\n", encoding="utf-8")
    window.load_pair({"id": f"local:{not_a_model}", "name": "Not a model", "target_dir": str(not_a_model),
                      "draft_dir": None, "plan": {"engine": "torch", "device": "cpu", "dtype": None}})
    wait_until(app, lambda: window.load_error_box is not None, 120, "the refused folder")
    shots.shoot("23-load-failed-keeps-model")
    window.load_error_box.reject()
    wait_until(app, lambda: window.session.ready, 60, "the model kept loaded")

    # two busy loops detached from the app (the demo counts only other programs' CPU use)
    hogs = subprocess.run(["sh", "-c", f"for i in 1 2; do {sys.executable} -c 'while True: pass' >/dev/null "
                           "2>&1 & echo $!; done"], capture_output=True, text=True, check=True).stdout.split()
    try:
        window.toggle_demo(True)
        demo, states = window.demo, []
        demo.stateChanged.connect(states.append)
        if not demo.start(demo.prompt_edit.toPlainText(), {"max_new_tokens": 96, "temperature": 0.0}):
            raise RuntimeError(f"The demo did not start: {demo.error_label.text()}")
        wait_until(app, lambda: "replaying" in states and demo.state == "finished", 600, "the demo on a busy machine")
        shots.shoot("24-speedup-demo-busy")
    finally:
        for pid in hogs:
            os.kill(int(pid), signal.SIGKILL)
    window.toggle_demo(False)


def shoot_my_models(app, window, shots: Shooter) -> None:
    """25: the model bar's list of my models: the built-in pairs and each model loaded before, with its path."""
    button, menu = window.model_bar.switch_button, window.model_bar.menu
    menu.popup(button.mapToGlobal(button.rect().bottomLeft()))
    settle(app, 0.6)
    shots.shoot("25-my-models", window)
    menu.hide()


def shoot_real_model(app, window, shots: Shooter) -> None:
    """18-19: SmolLM2-135M-Instruct, a real chat model (engine/chat_pair.py). 18: its GGUF opened from disk,
    no drafter, answering in English with the stats panel; 19: the same weights as a Hugging Face folder in
    llama.cpp, whose server is killed mid-answer: the chat names the crash and offers PyTorch."""
    from engine import chat_pair as smollm2
    try:
        gguf, folder = smollm2.gguf_path(), smollm2.hf_folder()
    except smollm2.Missing as exc:
        print(f"skipping 18-19: {exc}", flush=True)
        return
    import psutil
    answer_and_shoot(app, window, shots, "18-real-model-gguf-no-drafter",
                     "Name the largest planet in the solar system.",
                     {"id": f"local:{gguf}", "name": "SmolLM2-135M-Instruct.Q4_1", "target_dir": str(gguf),
                      "draft_dir": None, "plan": {"engine": "llamacpp", "device": "cpu", "dtype": None}})
    finished = new_chat(window)
    window.load_pair({"id": f"local:{folder}", "name": "SmolLM2-135M-Instruct", "target_dir": str(folder),
                      "draft_dir": None, "plan": {"engine": "llamacpp", "device": "cpu", "dtype": "float32"}})
    wait_until(app, lambda: window.session.ready, 240, "SmolLM2's folder to load in llama.cpp")
    start_long_answer(app, window, "Write a long story about a lighthouse keeper.")
    for child in psutil.Process(window.worker.client.pid).children(recursive=True):
        if child.name() == "llama-server":
            child.kill()
    wait_until(app, lambda: bool(finished), 60, "the crash report")
    window.show_stats(False)
    shots.shoot("19-llamacpp-crashed-offers-torch")


def shoot_chat_pair(app, window, shots: Shooter) -> None:
    """20-21, 30, 32, 35: what a first start opens where SmolLM2's package is installed: the chat pair (its GGUF and
    our drafter, llama.cpp on this CPU, calibrated), ready with its starter cards; then an English answer and the
    stats panel; then the same question on the torch engine, with a DSpark drafter and with an EAGLE-3 one."""
    from ui.main_window import starter_pair
    pair = starter_pair()
    if not pair or pair.id != "chat":
        print("skipping 20-21 and 30: the chat pair is not installed", flush=True)
        return
    answer_and_shoot(app, window, shots, "21-chat-pair-answer", "Explain the water cycle like I'm five.",
                     window.with_engine(pair), ready_name="20-chat-pair-first-start")
    # 30: the same pair on the torch engine, whose DFlash beats its own plain decoding: the panel says what the
    # draft pass cost and that the drafter drafted from the tokens SmolLM2 uses most
    answer_and_shoot(app, window, shots, "30-chat-pair-torch-draft-pass", "Explain the water cycle like I'm five.",
                     pair.with_plan(engine="torch", dtype=None))
    # 32: SmolLM2 opened from disk with the chat drafter saved as a DSpark one (a Markov head of zeros, drafting
    # after the last token: it drafts what the DFlash drafter drafts) on the torch engine; the panel names DSpark
    sys.path.insert(0, str(ROOT))
    from engine import chat_pair as smollm2
    from tests.tiny_torch import dspark_from
    dspark = dspark_from(smollm2.DRAFT_DIR, Path(tempfile.mkdtemp(prefix="dspark-")) / "SmolLM2-DSpark", scale=0.0,
                         sample_from_anchor=False)
    answer_and_shoot(app, window, shots, "32-chat-pair-dspark-torch", "Explain the water cycle like I'm five.",
                     {"id": f"local:{smollm2.gguf_path()}", "name": "SmolLM2-135M-Instruct + DSpark",
                      "target_dir": str(smollm2.gguf_path()), "draft_dir": str(dspark),
                      "plan": {"engine": "torch", "device": "cpu", "dtype": None}})
    # 35: SmolLM2 opened from disk with a random EAGLE-3 drafter (SpecForge's layout, a head over 8,192 tokens; no
    # trained one exists for it) on the torch engine: the panel names EAGLE-3 and says why it ran slower
    from tests.tiny_torch import random_eagle3
    cfg = json.loads((smollm2.hf_folder() / "config.json").read_text(encoding="utf-8"))
    eagle3 = random_eagle3(Path(tempfile.mkdtemp(prefix="eagle3-")) / "SmolLM2-EAGLE3", cfg, None, draft_vocab=8192)
    answer_and_shoot(app, window, shots, "35-chat-pair-eagle3-torch", "Explain the water cycle like I'm five.",
                     {"id": f"local:{smollm2.gguf_path()}", "name": "SmolLM2-135M-Instruct + EAGLE-3",
                      "target_dir": str(smollm2.gguf_path()), "draft_dir": str(eagle3),
                      "plan": {"engine": "torch", "device": "cpu", "dtype": None}})
    window.show_stats(False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--theme", default="light", choices=("light", "dark"))
    parser.add_argument("--only-real", action="store_true", help="only 18-21, 26-27, 30, 32 and 35, the real chat model")
    parser.add_argument("--only-gpu", action="store_true", help="only 17, 28, 29, 31, 33 and 34, the pickers on recorded GPUs")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="dflash-shots-"))
    os.environ["DFLASH_DESKTOP_HOME"] = str(home)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    args.out.mkdir(parents=True, exist_ok=True)
    pair = pick_pair(home)

    from PySide6.QtWidgets import QApplication

    from dflash_desktop import settings as settings_mod
    from ui import theme
    from ui.main_window import MainWindow

    app = QApplication([sys.argv[0]])
    app.setApplicationName("DFlash Desktop")
    settings = settings_mod.load()
    settings.theme, settings.max_new_tokens = args.theme, 160
    theme.apply(app, settings.theme, settings.font_size)
    window = MainWindow(settings=settings, pair=pair)
    window.move(0, 0)
    window.resize(1400, 860)
    window.show()
    shots = Shooter(app, window, args.out)
    c = window.controller
    try:
        if args.only_gpu:
            shoot_picker_on_a_12gb_gpu(app, window, shots)
            shoot_picker_on_a_vulkan_gpu(app, window, shots)
            shoot_picker_choosing_llamacpp_on_nvidia(app, window, shots)
            shoot_picker_dflash2_in_llamacpp(app, window, shots)
            shoot_picker_dspark_in_torch(app, window, shots)
            shoot_picker_eagle3_in_torch(app, window, shots)
            return 0
        if args.only_real:
            wait_until(app, lambda: window.session.ready, 240, "the model to load")
            shoot_real_model(app, window, shots)
            shoot_chat_pair(app, window, shots)
            shoot_picker_choices(app, window, shots)
            return 0
        # 1. first run: model loaded (and the baseline calibrated), empty chat ready for a prompt
        window.show_stats(False)
        wait_until(app, lambda: window.session.ready, 240, "the model to load and calibrate")
        shots.shoot("01-first-run")

        # 2. a chat answer with drafted text highlighted
        window.highlight_action.setChecked(True)
        finished: list[dict] = []
        c.answerFinished.connect(finished.append)
        window.chat_view.input.setPlainText(CHAT_PROMPT)
        window.chat_view.submit()
        wait_until(app, lambda: bool(finished), 240, "the chat answer")
        shots.shoot("02-chat-highlighting")

        # 3. the stats panel next to that answer
        window.show_stats(True)
        shots.shoot("03-stats-panel")
        first_chat = c.conversation_id

        # 14. the first-run welcome (a new profile sees it once; Help > Welcome reopens it)
        welcome = window.show_welcome()
        wait_until(app, lambda: "checking" not in welcome.hardware.text(), 60, "the hardware probe")
        shots.shoot("14-welcome", welcome)
        welcome.accept()

        # 15. the answer written again, sampled: two versions behind < >, and the chats list searched
        finished.clear()
        c.regenerate_at(0.8)
        wait_until(app, lambda: bool(finished), 240, "the second version")
        window.sidebar.search.setText("main")
        shots.shoot("15-versions-and-search")
        window.sidebar.search.clear()

        # 16. the chat's own settings over the global ones
        dialog = window.open_chat_settings()
        shots.shoot("16-chat-settings", dialog)
        dialog.reject()

        # 11. an English question to the code completion model: the banner, and what the panel makes of it
        # (every draft verified, no plain fallback: what DFlash does with text unlike its training, measured)
        c.new_chat()
        finished.clear()
        window.settings.draft_cutoff, window.settings.plain_fallback = 0.0, False
        window.chat_view.input.setPlainText("Explain speculative decoding in two sentences.")
        window.chat_view.submit()
        wait_until(app, lambda: bool(finished), 240, "the answer to the English question")
        shots.shoot("11-code-model-prose-question")
        print("panel warning:", window.stats_panel.values.get("warning"), flush=True)
        window.settings.draft_cutoff, window.settings.plain_fallback = None, True

        # 4. side-by-side demo after a real measurement and a full replay
        window.show_stats(False)
        window.toggle_demo(True)
        demo = window.demo
        states: list[str] = []
        demo.stateChanged.connect(states.append)
        if not demo.start(demo.prompt_edit.toPlainText(), {"max_new_tokens": 160, "temperature": 0.0}):
            raise RuntimeError(f"The demo did not start: {demo.error_label.text()}")
        wait_until(app, lambda: "replaying" in states and demo.state == "finished", 600, "the demo run and replay")
        shots.shoot("04-speedup-demo")

        # 5. the model picker over the main window
        window.toggle_demo(False)
        picker = window.open_model_picker()
        ready: list[bool] = []
        picker.ready.connect(lambda: ready.append(True))
        wait_until(app, lambda: bool(ready), 60, "the model picker to scan")
        shots.shoot("05-model-picker", picker)
        picker.reject()
        shoot_picker_on_a_12gb_gpu(app, window, shots)
        shoot_picker_on_a_vulkan_gpu(app, window, shots)
        shoot_picker_choosing_llamacpp_on_nvidia(app, window, shots)
        shoot_picker_dflash2_in_llamacpp(app, window, shots)
        shoot_picker_dspark_in_torch(app, window, shots)
        shoot_picker_eagle3_in_torch(app, window, shots)

        # 8. a model planned for an NVIDIA GPU on a computer without one: refused in a dialog, with the way out,
        # while the model loaded before stays
        c.new_chat()
        window.load_pair(pair.with_plan(engine="torch", device="cuda", dtype="bfloat16"))
        wait_until(app, lambda: window.load_error_box is not None, 120, "the GPU refusal")
        window.show_stats(True)
        shots.shoot("08-gpu-refused-offers-cpu")
        window.load_error_box.action_button.click()
        wait_until(app, lambda: window.session.ready, 240, "the model to load on the CPU")
        window.show_stats(False)

        # 6. an error: the engine killed in the middle of an answer
        c.new_chat()
        finished.clear()
        start_long_answer(app, window, "class Stack:\n")
        os.kill(window.worker.client.pid, signal.SIGKILL)
        wait_until(app, lambda: bool(finished), 60, "the crash report")
        shots.shoot("06-error-worker-killed")

        # 7. settings: the limits' help as tooltips, the plain fallback and offline switches
        dialog = window.open_settings()
        shots.shoot("07-settings", dialog)
        dialog.reject()

        # 9. the local server on, answering a request from another program (status bar: address, activity);
        # the engine killed in 6 took the loaded pair with it: load it again first (the server never loads)
        window.load_pair(pair)
        wait_until(app, lambda: window.session.ready, 240, "the model to load again")
        import json
        import threading
        import urllib.request
        import socket
        with socket.socket() as probe:      # a free port, so an app running elsewhere is no obstacle
            probe.bind(("127.0.0.1", 0))
            window.settings.server_port = probe.getsockname()[1]
        window.server_action.trigger()
        wait_until(app, lambda: window.local_server.url is not None, 30, "the local server")
        body = json.dumps({"prompt": "class Stack:\n", "max_tokens": 600}).encode()
        request = urllib.request.Request(window.local_server.url + "/completions", body,
                                         {"Content-Type": "application/json"})
        threading.Thread(target=lambda: urllib.request.urlopen(request, timeout=600).read(), daemon=True).start()
        wait_until(app, lambda: window.server_status.activity.text().startswith("serving"), 120, "a server request")
        shots.shoot("09-local-server-busy")
        window.server_action.trigger()

        # 10. Models… > Add a server: the base URL and key of a vLLM or SGLang server with DFlash
        picker = window.open_model_picker()
        dialog = picker.add_server()
        dialog.url.setCurrentText("http://gpu-box:8000/v1")
        shots.shoot("10-add-a-server", dialog)
        dialog.reject()
        picker.reject()

        # 12. the smallest window: 800x600, the first chat with its stats (the chats list folds away)
        c.open_conversation(first_chat)
        window.show_stats(True)
        window.resize(800, 600)
        shots.shoot("12-window-800x600")

        # 13. a large font (16 pt) at 1400x860: numbers wrap instead of being cut
        window.settings.font_size = 16
        window.apply_settings(window.settings)
        window.resize(1400, 860)
        shots.shoot("13-large-font")
        window.settings.font_size = settings_mod.Settings().font_size
        window.apply_settings(window.settings)
        shoot_trust_states(app, window, shots, home)
        shoot_real_model(app, window, shots)
        shoot_chat_pair(app, window, shots)
        shoot_picker_choices(app, window, shots)
        shoot_my_models(app, window, shots)

    finally:
        window.close()
    too_big = [p.name for p in shots.saved if p.stat().st_size > 300 * 1024]
    if too_big:
        print(f"Over 300 KB: {', '.join(too_big)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
