"""The main window: conversations on the left, the chat (or the speedup demo) in the middle, the
DFlash stats dock on the right, actions in the toolbar and the model's state in the status bar.

Public handles for scripts and tests: `chat_view`, `stats_panel`, `sidebar`, `session` (the loaded pair),
`controller` (the answers), the
actions (`new_chat_action`, `models_action`, `demo_action`, `highlight_action`, `stats_action`,
`settings_action`, `server_action`, `stop_action`), `local_server` and `server_status`, and `show_stats()`,
`toggle_demo()`, `toggle_server()`, `open_model_picker()`, `open_settings()`, `open_chat_settings()`,
`export_chat()`, `import_chat()`, `show_error()`, `show_notice()`, `show_store_notice()`, `show_store_error()`,
`bring_to_front()`.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, QTimer
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (QApplication, QFileDialog, QLabel, QMainWindow, QMessageBox, QProgressBar,
                               QSplitter, QStackedWidget, QToolBar, QToolButton, QVBoxLayout, QWidget)

from dflash_desktop import chat_export, downloads, run_plan
from dflash_desktop import settings as settings_mod
from dflash_desktop.catalog import CatalogError, load_catalog
from dflash_desktop.chat_store import ChatStore, ChatStoreError, open_store
from dflash_desktop.offers import Offers
from dflash_desktop.pairs import LoadedPair, PairRequest
from dflash_desktop.qt_worker import QtWorker
from engine.backends import ENGINES, device_class_of, missing_engines

from . import theme, tooltips
from .chat_controller import ChatController
from .model_bar import ElidedLabel, ModelBar
from .pair_session import PairSession
from .chat_settings_dialog import ChatSettingsDialog
from .chat_view import ChatView
from .message_widget import MessageWidget
from .conversation_list import ConversationList
from .server_status import LocalServer, ServerStatus
from .settings_dialog import FIELDS as DIALOG_FIELDS, SettingsDialog
from .stats_panel import StatsPanel
from .welcome import WelcomeDialog, about_text


def embedded_request(pair) -> PairRequest | None:
    """A built-in pair as a load request, or None when its files are not here."""
    if not pair.installed():
        return None
    return PairRequest(pair.id, pair.name, str(pair.local_path("target")), str(pair.local_path("drafter")))


def demo_pair() -> PairRequest | None:
    """The code pair, whose files ship inside the app, as a load request (None when they are missing)."""
    try:
        return embedded_request(load_catalog().demo)
    except Exception:  # noqa: BLE001 (a broken install still opens the window)
        return None


def starter_pair() -> PairRequest | None:
    """What a first start opens: the chat pair where its model is installed, else the code pair."""
    try:
        return embedded_request(load_catalog().starter())
    except Exception:  # noqa: BLE001 (a broken install still opens the window)
        return None


def startup_pair(settings: settings_mod.Settings) -> PairRequest | None:
    """The last pair if its files still exist (or it is on a server), else the starter pair."""
    last = PairRequest.of(settings.last_pair) if settings.last_pair else None   # checked when the settings load
    if last and (last.remote or Path(last.target_dir or "").exists()):
        return last
    return starter_pair()


class MainWindow(QMainWindow):
    def __init__(self, worker: QtWorker | None = None, store: ChatStore | None = None,
                 settings: settings_mod.Settings | None = None, pair: PairRequest | dict | None = None, autoload: bool = True,
                 store_notice: str | None = None):
        """Without ``store`` the chat store is opened with ``open_store``, whose notice (a damaged file moved
        aside, a read-only store) becomes ``store_notice``; a given store may come with its own notice."""
        super().__init__()
        tooltips.install(QApplication.instance())      # long tips as paragraphs, not screen-wide lines
        self.setWindowTitle("DFlash Desktop")
        self.setObjectName("mainWindow")
        self.resize(1280, 820)
        self.setMinimumSize(640, 480)
        self.settings = settings or settings_mod.load()
        downloads.set_offline(self.settings.offline)
        self._owns_worker = worker is None
        self.worker = worker or QtWorker(self)
        self._owns_store = store is None
        if store is None:
            store, store_notice = open_store()
        self.store, self.store_notice = store, store_notice
        self.demo = None
        self._shown_pair: LoadedPair | None = None   # the loaded pair the status bar shows

        self.chat_view = ChatView()
        self.chat_view.set_highlight(self.settings.highlight_drafted)
        self.stats_panel = StatsPanel(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.stats_panel)
        self.stats_panel.setVisible(self.settings.show_stats)
        self.sidebar = ConversationList()
        self.stack = QStackedWidget()
        self.stack.addWidget(self.chat_view)
        splitter = QSplitter()
        splitter.setObjectName("mainSplitter")
        splitter.addWidget(self.sidebar)
        splitter.addWidget(self.stack)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([240, 760])
        splitter.setCollapsible(0, True)      # the chats list folds away on a small screen
        splitter.setCollapsible(1, False)
        self.sidebar.setMinimumWidth(150)
        self.stack.setMinimumWidth(300)
        self.splitter = splitter
        self._auto_hidden_sidebar = False
        # the loaded model on top, as LM Studio and Jan show it; the chats list and the chat below
        self.model_bar = ModelBar(self._my_models, self)
        self.pair_label = self.model_bar.label
        central = QWidget(self)
        column = QVBoxLayout(central)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.model_bar)
        column.addWidget(splitter, 1)
        self.setCentralWidget(central)

        self.session = PairSession(self.worker, self.settings, self.stats_panel, self)
        self.picked_engines: dict[str, list[str]] = {}   # pair id -> the engines its catalog lists (the picker's)
        self.session.engines_of = self.catalog_engines
        self.controller = ChatController(self.worker, self.session, self.store, self.settings, self.chat_view,
                                         self.stats_panel, self)
        self.local_server = LocalServer(self.worker, self._served_name, self)
        self._reloading_after_crash = False   # set by _worker_error, cleared by the next successful load
        self.load_error_box = None            # the last failed load's dialog (tests and screenshots read it)
        self._build_actions()
        self._build_status_bar()
        self._tab_order()
        self._wire()
        self.resizeDocks([self.stats_panel], [360], Qt.Orientation.Horizontal)
        self._restore_layout()
        self.refresh_conversations()
        last = self.settings.last_conversation
        if last and self.store.conversation(last) is not None:
            self.controller.open_conversation(last)
        pair = PairRequest.of(pair) if pair else startup_pair(self.settings)
        if autoload and pair:   # with the engine Settings > Engine prefers, as every later load
            QTimer.singleShot(0, self, lambda: self.load_pair(self.with_engine(pair)))
        elif autoload:
            QTimer.singleShot(0, lambda: self.status_label.setText(
                "No model yet: the built-in models are not installed. Choose one with Models… (Ctrl+M)."))

    # -- construction -------------------------------------------------------------------------------
    def _action(self, text: str, shortcut, slot, tip: str, checkable: bool = False) -> QAction:
        action = QAction(text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.setToolTip(f"{tip} ({QKeySequence(shortcut).toString(QKeySequence.SequenceFormat.NativeText)})"
                          if shortcut else tip)
        action.setStatusTip(tip)
        action.setCheckable(checkable)
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        (action.toggled if checkable else action.triggered).connect(slot)
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        self.new_chat_action = self._action("New chat", QKeySequence.StandardKey.New, self.controller.new_chat,
                                            "Start a new chat")
        self.models_action = self._action("Models…", "Ctrl+M", self.open_model_picker, "Choose a model pair")
        self.demo_action = self._action("Speedup demo", "Ctrl+D", self.toggle_demo,
                                        "Compare DFlash with plain decoding side by side", checkable=True)
        self.highlight_action = self._action("Highlight drafted", "Ctrl+H", self._set_highlight,
                                             "Tint the text that the drafter wrote and the target accepted",
                                             checkable=True)
        self.highlight_action.setChecked(self.settings.highlight_drafted)
        self.stats_action = self.stats_panel.toggleViewAction()
        self.stats_action.setText("Stats")
        self.stats_action.setShortcut(QKeySequence("Ctrl+I"))
        self.stats_action.setToolTip("Show or hide the DFlash stats panel (Ctrl+I)")
        self.settings_action = self._action("Settings", "Ctrl+,", self.open_settings,
                                            "Sampling, block size, draft cutoff, theme")
        self.server_action = self._action("Local server", "Ctrl+Shift+L", self.toggle_server,
                                          "Serve the loaded model to other programs on this computer "
                                          "(OpenAI-compatible API)", checkable=True)
        self.stop_action = self._action("Stop", "Esc", self.controller.stop, "Stop the answer being written")
        self.send_action = self._action("Send", "Ctrl+Return", self.chat_view.submit, "Send the message")
        self.quit_action = self._action("Quit", "Ctrl+Q", self.close, "Quit DFlash Desktop")
        self.sidebar_action = self._action("Chats list", "Ctrl+B", self.show_sidebar,
                                           "Show or hide the list of chats", checkable=True)
        self.sidebar_action.setChecked(True)
        self.copy_answer_action = self._action("Copy last answer", "Ctrl+Shift+C", self.copy_last_answer,
                                               "Copy the newest answer's text")
        self.copy_code_action = self._action("Copy last code block", "Ctrl+Shift+K", self.copy_last_code,
                                             "Copy the newest answer's last code block")
        self.regenerate_action = self._action("Regenerate", "Ctrl+R", self.controller.regenerate,
                                              "Write the newest answer again")
        self.edit_last_action = self._action("Edit last message", "Ctrl+Shift+E", self.edit_last_message,
                                             "Edit your newest message and send it again")
        self.focus_input_action = self._action("Go to the message box", "Ctrl+L", lambda: self.chat_view.input.setFocus(),
                                               "Put the cursor in the message box")
        self.remeasure_action = self._action("Re-measure baseline", "Ctrl+Shift+B", self.session.calibrate,
                                             "Measure plain decoding of the loaded model again")
        self.unload_action = self._action("Unload model", "Ctrl+U", self.unload,
                                          "Free the model's memory; your next message loads it again")
        self.shortcuts_action = self._action("Keyboard shortcuts", "F1", self.show_shortcuts,
                                             "List every keyboard shortcut")
        self.about_action = self._action("About DFlash Desktop", None, self.show_about, "Versions and licence")
        self.welcome_action = self._action("Welcome", "Shift+F1", self.show_welcome,
                                           "What DFlash is, what the demo model does, where to get models")
        self.find_action = self._action("Search chats", "Ctrl+F", self.focus_search,
                                        "Find chats by title or message text")
        self.export_action = self._action("Export chat…", "Ctrl+Shift+S", lambda: self.export_chat(),
                                          "Save this chat as Markdown, or as JSON to import again")
        self.import_action = self._action("Import chat…", "Ctrl+O", lambda: self.import_chat(),
                                          "Add a chat exported as JSON")
        self.previous_version_action = self._action("Previous answer version", "Ctrl+[",
                                                    lambda: self.step_last_answer_version(-1),
                                                    "Show the newest answer's previous version")
        self.next_version_action = self._action("Next answer version", "Ctrl+]",
                                                lambda: self.step_last_answer_version(1),
                                                "Show the newest answer's next version")
        self.chat_settings_action = self._action("Chat settings…", "Ctrl+Shift+T", self.open_chat_settings,
                                                 "Temperature and max tokens for this chat only")

        bar = QToolBar("Main")
        bar.setObjectName("mainToolbar")
        bar.setMovable(False)
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        for action in (self.new_chat_action, self.models_action, None, self.demo_action, self.highlight_action,
                       self.stats_action, None, self.server_action, self.settings_action):
            bar.addSeparator() if action is None else bar.addAction(action)
        for action in bar.actions():
            widget = bar.widgetForAction(action)
            if widget is not None and action.text():
                widget.setAccessibleName(action.text().rstrip("…"))
        self.toolbar = bar    # items that do not fit go into its » menu (Qt's extension button)
        self.addToolBar(bar)
        more = bar.findChild(QToolButton, "qt_toolbar_ext_button")
        if more is not None:
            more.setToolTip("More: the toolbar buttons that do not fit (the menu bar has them all too)")
            more.setAccessibleName("More toolbar buttons")
        self._build_menus()

    def _build_menus(self) -> None:
        """Every action, with its shortcut, in a menu bar: File, Edit, View, Model, Help."""
        menus = {"&File": (self.new_chat_action, None, self.export_action, self.import_action, None, self.quit_action),
                 "&Edit": (self.send_action, self.stop_action, None, self.copy_answer_action, self.copy_code_action,
                           self.edit_last_action, self.regenerate_action, self.previous_version_action,
                           self.next_version_action, None, self.focus_input_action,
                           self.find_action, self.chat_settings_action),
                 "&View": (self.sidebar_action, self.stats_action, self.highlight_action, None, self.demo_action),
                 "&Model": (self.models_action, self.unload_action, self.remeasure_action, None, self.server_action, self.settings_action),
                 "&Help": (self.welcome_action, self.shortcuts_action, self.about_action)}
        self.menus = {}
        for title, actions in menus.items():
            menu = self.menuBar().addMenu(title)
            for action in actions:
                menu.addSeparator() if action is None else menu.addAction(action)
            self.menus[title.replace("&", "")] = menu

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.status_label = ElidedLabel("Starting…")
        self.status_label.setAccessibleName("Model status")
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setFixedWidth(140)
        self.progress.setFixedHeight(12)
        self.progress.setTextVisible(False)
        self.progress.setAccessibleName("Model loading progress")
        self.progress.hide()
        bar.addWidget(self.status_label, 1)
        bar.addPermanentWidget(self.progress)
        self.read_only_label = QLabel("Chats read-only")
        self.read_only_label.setToolTip(self.store.read_only or "")
        self.read_only_label.setAccessibleName("Chats are read-only")
        bar.addPermanentWidget(self.read_only_label)
        self.read_only_label.setVisible(bool(self.store.read_only))
        self.server_status = ServerStatus(self.server_action)
        bar.addPermanentWidget(self.server_status)

    def _tab_order(self) -> None:
        """Tab reads the window as people do: the model bar, the chats list, the chat (its messages, then the
        message box and Send), the stats panel, and the status bar last."""
        chain = [self.model_bar.switch_button, self.sidebar, self.chat_view, self.stats_panel.remeasure_button,
                 self.server_status.switch, self.server_status.copy_button]
        for before, after in zip(chain, chain[1:]):
            QWidget.setTabOrder(before, after)

    def _wire(self) -> None:
        p, c = self.session, self.controller
        p.statusMessage.connect(self.status_label.setText)
        p.loadingChanged.connect(self._loading)
        p.pairLoaded.connect(self._show_pair)
        p.pairLoaded.connect(lambda _ev: setattr(self, "_reloading_after_crash", False))
        p.pairUnloaded.connect(lambda: self.pair_label.setText(f"{p.display_name or 'Model'}  ·  unloaded"))
        self.model_bar.pairChosen.connect(lambda pair: self.load_pair(self.with_engine(pair)))
        self.model_bar.browseRequested.connect(self.open_model_picker)
        p.loadFailed.connect(self._load_failed)
        c.statusMessage.connect(self.status_label.setText)
        c.conversationsChanged.connect(self.refresh_conversations)
        c.currentConversationChanged.connect(lambda cid: self.sidebar.select(cid if cid >= 0 else None))
        c.chatUnreadable.connect(self._chat_unreadable)
        self.sidebar.conversationChosen.connect(c.open_conversation)
        self.sidebar.conversationChosen.connect(lambda _cid: self.toggle_demo(False))   # a chosen chat is shown
        c.currentConversationChanged.connect(lambda _cid: self.toggle_demo(False))
        self.sidebar.newChatRequested.connect(c.new_chat)
        self.sidebar.deleteRequested.connect(c.delete_conversation)
        self.sidebar.renameRequested.connect(c.rename_conversation)
        self.sidebar.searchChanged.connect(self.refresh_conversations)
        self.chat_view.chatSettingsRequested.connect(self.open_chat_settings)
        self.worker.error.connect(self._worker_error)
        self.worker.jobs.connect(self.server_status.show_jobs)
        self.local_server.changed.connect(self._server_changed)
        self.local_server.failed.connect(self._server_failed)

    # -- slots --------------------------------------------------------------------------------------
    def refresh_conversations(self) -> None:
        """The chats list, filtered by the search box (titles and message text) when it holds text."""
        query = self.sidebar.search.text().strip()
        found = self.store.search(query) if query else self.store.conversations()
        self.sidebar.set_conversations(found, self.controller.conversation_id)

    def focus_search(self) -> None:
        self.show_sidebar(True)
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def export_chat(self, path: str | Path | None = None) -> Path | None:
        """Write the chat on screen where the user chooses (``path``: already chosen): .json or Markdown."""
        conv = self.store.conversation(self.controller.conversation_id or 0)
        if conv is None:
            self.status_label.setText("Nothing to export yet: open a chat, or send a first message.")
            return None
        if path is None:
            name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conv.title).strip() or "chat"
            path, kind = QFileDialog.getSaveFileName(self, "Export chat", str(Path.home() / f"{name}.md"),
                                                     "Markdown, to read (*.md);;JSON, to import again (*.json)")
            if not path:
                return None
            if not Path(path).suffix:
                path += ".json" if "json" in kind else ".md"
        try:
            written = chat_export.export_chat(self.store, conv.id, path)
        except OSError as exc:
            self._message(QMessageBox.Icon.Warning, f"The chat could not be exported to {path}: {exc}. Choose a "
                                                    "folder you can write to, with free space.")
            return None
        self.status_label.setText(f"Exported “{conv.title}” to {written}.")
        return written

    def import_chat(self, path: str | Path | None = None):
        """Add a chat from a JSON export and open it; a bad file is refused with the reason, adding nothing."""
        if path is None:
            path = QFileDialog.getOpenFileName(self, "Import chat", str(Path.home()),
                                               "Chat exported as JSON (*.json)")[0]
            if not path:
                return None
        try:
            conv = chat_export.import_chat(self.store, path)
        except chat_export.ChatImportError as exc:
            self._message(QMessageBox.Icon.Warning, str(exc))
            return None
        self.sidebar.search.clear()      # the new chat shows whatever was searched
        self.refresh_conversations()
        self.controller.open_conversation(conv.id)
        self.status_label.setText(f"Imported “{conv.title}” from {path}.")
        return conv

    def open_chat_settings(self) -> ChatSettingsDialog:
        """The chat on screen's own temperature and max tokens (non-blocking); returned for tests."""
        conv = self.store.conversation(self.controller.conversation_id or 0)
        dialog = ChatSettingsDialog(conv.title if conv else "this new chat", self.controller.chat_overrides(),
                                    self.settings, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.controller.set_chat_overrides(dialog.result_overrides))
        dialog.open()
        return dialog

    def _show_pair(self, loaded: LoadedPair) -> None:
        self._shown_pair = loaded
        name = self.session.display_name
        if not loaded.offers.local:
            self.pair_label.setText(f"{name}  ·  on {loaded.device}")
            return
        rss = self.session.engine_memory()
        memory = f"  ·  {rss / 2**20:,.0f} MB" if rss else ""
        spec = loaded.speculation or {}
        if loaded.method != "none":
            lookup = loaded.event.get("ngram_block") if loaded.method == "ngram" and not spec else None
            how = (f"{spec['n_max']} drafts a step" if spec.get("n_max") and not self.settings.block_size
                   else f"up to {lookup - 1} drafts a step" if lookup else self._block_text(loaded.block_size))
            method = f"{loaded.method_label}, {how}"
        elif spec:
            method = "plain (measured fastest here)" if self.settings.plain_fallback else "drafting at its fastest"
        else:
            method = "plain, no drafter"
        self.pair_label.setText(f"{name}  ·  {loaded.engine} on {loaded.where}, {loaded.dtype}{memory}  ·  {method}")

    def _block_text(self, drafters: int | None) -> str:
        """The block size answers run with: the setting's, where it overrides the drafter's own."""
        used = self.settings.generation(drafters).get("block_size", drafters)
        return f"block {used}" if used == drafters else f"block {used} (drafter's {drafters})"

    def _loading(self, busy: bool, text: str) -> None:
        self.progress.setVisible(busy)
        if text:
            self.status_label.setText(text)

    def _worker_error(self, ev: dict) -> None:
        if ev.get("code") == "worker_crashed" and self.local_server.url and self.session.pair \
                and not self._reloading_after_crash:
            # other programs use the model through the local server: it must not wait for a chat message. Once
            # per successful load: an engine that dies while loading is not started again and again.
            self._reloading_after_crash = True
            self.statusBar().showMessage("The engine stopped; the local server is on, so the model is loading "
                                         "again.", 10_000)
            pair = self.session.pair
            QTimer.singleShot(0, self, lambda: self.load_pair(pair))
        elif ev.get("code") in ("worker_crashed", "worker_start_failed"):
            self.statusBar().showMessage("The engine stopped; your next message restarts it.", 10_000)

    def _load_failed(self, ev: dict, way_out, failed: str, kept: str | None) -> None:
        """An answer waiting for the load shows the error in its chat; otherwise a dialog says it, with the
        way out, and whether the model loaded before is still there."""
        if kept:
            self._show_pair(self.session.loaded)
        else:
            self.pair_label.setText("No model loaded")
        if self.controller.fail_waiting(ev):
            return
        from .errors import LoadErrorDialog
        if self.load_error_box is not None:
            self.load_error_box.deleteLater()         # kept until the next one: tests and screenshots read it
        self.load_error_box = LoadErrorDialog(ev, failed, kept, self, action=way_out)
        self.load_error_box.finished.connect(self._load_error_closed)
        self.load_error_box.open()

    def _load_error_closed(self) -> None:
        """The dialog told the error; the status line goes back to the model still loaded (not a stale error)."""
        if self.session.ready and self.session.ready_text:
            self.status_label.setText(self.session.ready_text)

    def load_pair(self, pair: PairRequest | dict) -> None:
        """Load a pair in place of the loaded one; an answer being written stops first."""
        pair = PairRequest.of(pair)
        self.controller.stop()
        self.session.load_pair(pair)
        self.pair_label.setText(f"Loading {pair.name or 'the model'}…")

    def _my_models(self) -> tuple[list[PairRequest], str | None]:
        """The model bar's menu: the built-in pairs installed here, then every pair loaded before; and the id of
        the one loaded."""
        mine: list[PairRequest] = []
        try:
            catalog = load_catalog()
            mine = [r for r in map(embedded_request, catalog.embedded) if r]
        except (CatalogError, OSError):
            pass
        seen = {p.id for p in mine}
        for raw in self.settings.recent_pairs:
            pair = PairRequest.of(raw)
            if pair.id not in seen:
                mine.append(pair)
                seen.add(pair.id)
        return mine, self.session.pair.id if self.session.pair else None

    def unload(self) -> None:
        """Free the model's memory; an answer being written stops first."""
        if self.session.loaded and self.session.loaded.offers.unload:
            self.controller.stop()
        self.session.unload()

    def _set_highlight(self, on: bool) -> None:
        self.chat_view.set_highlight(on)
        self.settings.highlight_drafted = on
        self.session.save_settings()

    def toggle_server(self, on: bool) -> None:
        """Start or stop the local server on the port and key from the settings."""
        if on:
            self.local_server.start(self.settings.server_port, self.settings.server_api_key)
        else:
            self.local_server.stop()

    def _served_name(self) -> str | None:
        """The model name clients see: the catalog id of a catalog pair, the server's own name of a remote one;
        for a model opened from disk None, so the server names it after its folder or file, never by its path."""
        info = self.worker.pair_info or {}
        if not Offers.of(info).local:
            return info.get("name")
        pair = self.session.pair
        return pair.id if pair and not pair.id.startswith("local:") else None

    def _server_changed(self, url: str | None) -> None:
        self.server_status.show_url(url)
        if self.server_action.isChecked() != bool(url):
            self.server_action.setChecked(bool(url))
        key = " (API key required)" if self.settings.server_api_key else ""
        self.status_label.setText(f"Local server on at {url}{key}: point the openai package or curl at it."
                                  if url else "Local server stopped.")

    def _server_failed(self, message: str) -> None:
        self.server_action.setChecked(False)
        self.status_label.setText(f"The local server did not start: {message}")

    # -- keyboard reach for the per-message actions ---------------------------------------------------
    def _answers(self) -> list[MessageWidget]:
        return [w for w in self.chat_view.messages if isinstance(w, MessageWidget) and w.role == "assistant"]

    def copy_last_answer(self) -> None:
        answers = self._answers()
        if answers:
            answers[-1].copy_to_clipboard()
            self.statusBar().showMessage("Copied the answer.", 3000)

    def copy_last_code(self) -> None:
        answers = [w for w in self._answers() if w.code_blocks]
        if answers:
            QGuiApplication.clipboard().setText(answers[-1].code_blocks[-1])
            self.statusBar().showMessage("Copied the code block.", 3000)

    def step_last_answer_version(self, step: int) -> None:
        answers = self._answers()
        if answers and answers[-1].version_count > 1:
            answers[-1].step_version(step)
        else:
            self.status_label.setText("The newest answer has one version: Regenerate (Ctrl+R) writes another.")

    def edit_last_message(self) -> None:
        users = [w for w in self.chat_view.messages if isinstance(w, MessageWidget) and w.role == "user"]
        if users and not self.controller.generating:
            users[-1].start_edit()

    def show_shortcuts(self) -> QMessageBox:
        rows = [(a.text().replace("&", "").rstrip("…"), a.shortcut().toString(QKeySequence.SequenceFormat.NativeText))
                for menu in self.menus.values() for a in menu.actions() if not a.isSeparator()]
        rows.append(("New line in the message box", "Shift+Enter"))
        rows.append(("Tab character in the message box", "Ctrl+Tab"))
        text = "".join(f"<tr><td>{name}</td><td>&nbsp;&nbsp;<b>{key or '—'}</b></td></tr>" for name, key in rows)
        return self._message(QMessageBox.Icon.Information, f"<table>{text}</table>")

    def show_about(self) -> QMessageBox:
        loaded = self.session.loaded
        return self._message(QMessageBox.Icon.Information, about_text(
            f"{loaded.engine} engine on {loaded.device}" if loaded else "no model loaded"))

    def show_welcome(self) -> WelcomeDialog:
        """The first-run welcome (app.py shows it once per profile); Help > Welcome reopens it."""
        dialog = WelcomeDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.openModels.connect(self.open_model_picker)
        dialog.open()
        if not self.settings.welcome_seen:
            self.settings.welcome_seen = True
            self.session.save_settings()
        return dialog

    # -- layout -------------------------------------------------------------------------------------
    def show_sidebar(self, visible: bool = True) -> None:
        """The chats list; on a narrow window it folds away by itself (and comes back when there is room)."""
        self._auto_hidden_sidebar = False
        self.sidebar.setVisible(visible)
        if visible and self.splitter.sizes()[0] == 0:
            self.splitter.setSizes([220, max(self.splitter.width() - 220, 300)])
        if self.sidebar_action.isChecked() != visible:
            self.sidebar_action.setChecked(visible)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if not hasattr(self, "sidebar_action"):
            return
        narrow = self.width() < 960
        if narrow and not self.sidebar.isHidden() and not self._auto_hidden_sidebar:
            self.sidebar.hide()
            self._auto_hidden_sidebar = True
            self.sidebar_action.blockSignals(True)
            self.sidebar_action.setChecked(False)
            self.sidebar_action.blockSignals(False)
        elif not narrow and self._auto_hidden_sidebar:
            self.show_sidebar(True)
        if narrow:   # leave the chat at least half the window
            self.resizeDocks([self.stats_panel], [min(self.stats_panel.width(), max(self.width() // 3, 200))],
                             Qt.Orientation.Horizontal)

    def _restore_layout(self) -> None:
        """Window size and place, the dock and the splitter as they were when the app closed."""
        s = self.settings
        if s.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(s.window_geometry.encode()))
        if s.window_state:
            self.restoreState(QByteArray.fromBase64(s.window_state.encode()))
            self.stats_panel.setVisible(s.show_stats)
        if s.splitter_state:
            self.splitter.restoreState(QByteArray.fromBase64(s.splitter_state.encode()))

    def _save_layout(self) -> None:
        s = self.settings
        s.window_geometry = bytes(self.saveGeometry().toBase64()).decode()
        s.window_state = bytes(self.saveState().toBase64()).decode()
        s.splitter_state = bytes(self.splitter.saveState().toBase64()).decode()
        s.last_conversation = self.controller.conversation_id

    def show_stats(self, visible: bool = True) -> None:
        self.stats_panel.setVisible(visible)

    def toggle_demo(self, on: bool) -> None:
        """Swap the central area between the chat and the side-by-side speedup demo."""
        if on and self.demo is None:
            try:
                from .speedup_demo import SpeedupDemo
            except ImportError as exc:
                self.status_label.setText(f"The speedup demo is not available in this build ({exc}).")
                self.demo_action.setChecked(False)
                return
            self.demo = SpeedupDemo(self.worker, self)
            self.demo.baselineMeasured.connect(self._demo_baseline)
            self.stack.addWidget(self.demo)
        if self.demo_action.isChecked() != on:
            self.demo_action.setChecked(on)
            return
        self.stack.setCurrentWidget(self.demo if on else self.chat_view)

    def _demo_baseline(self, done: dict, cpu_other) -> None:
        """The speedup demo's plain run becomes the loaded pair's baseline: one baseline, everywhere."""
        loaded = self.session.loaded
        same_pair = loaded is not None and (self.worker.pair_info or {}).get("target") == loaded.target
        if same_pair and loaded.offers.baseline:
            from dflash_desktop.session import BaselineRecord
            self.session.record_baseline(BaselineRecord.from_done(done, loaded.device, "speedup demo",
                                                                     cpu_other))

    def open_model_picker(self, catalog=None, hardware=None):
        """Open the model picker; a chosen pair is loaded and remembered. Returns the dialog (or None).
        catalog, hardware: given instead of the picker reading them (tests, screenshots)."""
        try:
            from .model_picker import ModelPicker
        except ImportError as exc:
            self.status_label.setText(f"The model picker is not available in this build ({exc}).")
            return None
        picker = ModelPicker(self, catalog=catalog, hardware=hardware, servers=self.settings.remote_servers,
                             measured=self.settings.measured)
        picker.pairChosen.connect(lambda pair: self._picked(picker, pair))
        picker.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        picker.open()
        return picker

    def open_settings(self) -> SettingsDialog:
        """Open the settings dialog (non-blocking); returns it so tests and scripts can drive it."""
        loaded = self.session.loaded
        engines = [(name, ENGINES[name].label) for name in self.engine_choices()]
        dialog = SettingsDialog(self.settings, loaded.block_size if loaded else None, self, engines=engines)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.result_settings))
        dialog.open()
        return dialog

    def engine_choices(self, pair: PairRequest | None = None) -> list[str]:
        """Engines that can run the pair (default: the loaded one) here from its folders (run_plan.py)."""
        pair, loaded = pair or self.session.pair, self.session.loaded
        if pair is None:
            return []
        try:
            entry = load_catalog().get(pair.id)
        except (KeyError, CatalogError):
            return []
        current = (pair.plan or {}).get("engine") or (loaded and loaded.engine) or "torch"
        device_class = device_class_of(loaded.engine or "" if loaded else "", loaded.device if loaded else "cpu")
        return run_plan.engine_choices(entry, current, device_class, missing_engines())

    def _picked(self, picker, pair: PairRequest) -> None:
        try:                                 # the picker's catalog (a refreshed one) knows the pair's engines
            self.picked_engines[pair.id] = list(picker.catalog.get(pair.id).engines)
        except (KeyError, AttributeError):
            pass
        self.load_pair(self.with_engine(pair))

    def catalog_engines(self, pair: PairRequest) -> list[str] | None:
        """The engines the catalog lists for a catalog pair: the worker compares only those at its first load
        (engine/fastest.py); None for a pair from disk, which any engine that reads its files may run."""
        if pair.id in self.picked_engines:
            return self.picked_engines[pair.id]
        try:
            return list(load_catalog().get(pair.id).engines)
        except (KeyError, CatalogError, OSError):
            return None

    def with_engine(self, pair: PairRequest | dict) -> PairRequest:
        """The pair with the engine the settings prefer, where that engine can run it from its folders. The
        model picker's plan (``planned``: engine, device and weights, quantized where the GPU needs it) wins
        whenever it names that engine."""
        pair = PairRequest.of(pair)
        planned, engine = pair.planned, self.settings.engine
        if planned and engine in ("auto", planned["engine"]):
            return replace(pair, plan=dict(planned))
        if engine == "auto" or engine == pair.run_plan["engine"] or engine not in self.engine_choices(pair):
            return pair
        return pair.with_plan(engine=engine, dtype=None)

    def apply_settings(self, new: settings_mod.Settings | None) -> None:
        if new is None:
            return
        reload = new.engine != self.settings.engine and self.session.pair is not None
        for field in DIALOG_FIELDS:
            setattr(self.settings, field, getattr(new, field))
        self.session.save_settings()
        downloads.set_offline(self.settings.offline)
        app = QApplication.instance()
        theme.apply(app, self.settings.theme, self.settings.font_size)   # every widget follows (theme.py)
        if self.session.loaded and self._shown_pair:
            self._show_pair(self._shown_pair)            # the block size it shows may have changed
        if reload:                                       # automatic: the worker's choice (engine "auto")
            self.load_pair(self.with_engine(self.session.pair.with_plan(engine="auto", dtype=None)))

    def _message(self, icon: QMessageBox.Icon, text: str) -> QMessageBox:
        box = QMessageBox(icon, "DFlash Desktop", text, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()  # window-modal, does not block: the window keeps drawing and tests can read the box
        return box

    def show_notice(self, text: str) -> QMessageBox:
        """Something the start had to work around (settings back to their defaults, a chat left closed)."""
        return self._message(QMessageBox.Icon.Warning, text)

    def _chat_unreadable(self, text: str) -> None:
        """A chat that cannot be drawn stayed closed: said in the status bar, and in a dialog once the window is
        up (this happens at start too, when it was the chat on screen at the last quit)."""
        self.status_label.setText(text)
        QTimer.singleShot(0, lambda: self.show_notice(text))

    def show_store_notice(self) -> QMessageBox | None:
        """Tell the user what opening the chats needed (a damaged file moved aside, read-only chats)."""
        return self._message(QMessageBox.Icon.Warning, self.store_notice) if self.store_notice else None

    def show_store_error(self, error: ChatStoreError) -> QMessageBox:
        """A refused or failed write: say so, and list the conversations as they really are stored."""
        self.status_label.setText(str(error))
        self.refresh_conversations()
        return self._message(QMessageBox.Icon.Warning, str(error))

    def bring_to_front(self) -> None:
        """A second launch asked for this window."""
        self.setWindowState((self.windowState() & ~Qt.WindowState.WindowMinimized) | Qt.WindowState.WindowActive)
        self.show()
        self.raise_()
        self.activateWindow()

    def show_error(self, error: dict):
        """Show an engine error the way a real one appears (bubble in the chat + status line)."""
        self.status_label.setText(f"Error: {error.get('message', '')}")
        return self.chat_view.add_error(error, self.session.loaded)

    # -- lifetime -----------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        self.settings.show_stats = self.stats_panel.isVisible()
        self._save_layout()
        self.session.save_settings()
        self.local_server.stop()
        if self._owns_worker:
            self.worker.shutdown(3.0)
        if self._owns_store:
            self.store.close()
        super().closeEvent(event)
