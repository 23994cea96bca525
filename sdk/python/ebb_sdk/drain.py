"""Drain detection: the job's drain signal plus the notice file and the
attempt's own metadata endpoint, polled. Outside Ebb nothing is installed
and nothing ever fires, even on a cloud VM with its own spot notices."""

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from typing import Callable, List, Optional

from ._env import in_ebb


class Notice:
    """A notice that the attempt must end: when it came, the forced-kill
    deadline, and why. `action` is "preempt" for a drain (the job runs
    again as its next attempt unless it finishes first) and "cancel" for a
    cancel (it never runs again; `reason` is "cancel")."""

    def __init__(self, raw: dict, source: str):
        self.raw = raw
        self.source = source
        self.action = raw.get("action", "preempt")
        self.reason = raw.get("reason", "")
        self.notice_at = _epoch(raw.get("notice_at"))
        self.deadline = _epoch(raw.get("deadline"))

    @property
    def cancelled(self) -> bool:
        """True for a cancel's notice: nothing will resume from a save."""
        return self.action == "cancel"

    def time_left(self) -> Optional[float]:
        """Seconds until the forced kill, if the deadline is known."""
        return None if self.deadline is None else self.deadline - time.time()

    def __repr__(self) -> str:
        return (
            f"Notice(source={self.source!r}, action={self.action!r}, "
            f"deadline={self.raw.get('deadline')!r}, reason={self.reason!r})"
        )


def _epoch(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class DrainWatcher:
    """Watches for this attempt's drain notice.

    Inside Ebb it installs a handler for the job's drain signal
    (`EBB_DRAIN_SIGNAL`, TERM by default) when created on the main thread,
    and polls the notice file and the metadata endpoint in a daemon thread,
    so a notice is seen even when the signal is taken by something else.
    Outside Ebb it does nothing: `drain_requested()` stays False and the
    signal keeps its default meaning.
    """

    def __init__(self, poll_interval: float = 1.0, install_signal: bool = True):
        self.active = in_ebb()
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: List[Callable[[Notice], None]] = []
        self._notice: Optional[Notice] = None
        self._previous = None
        self._poll_interval = poll_interval
        if not self.active:
            return
        self._drain_file = os.environ.get("EBB_DRAIN_FILE")
        self._url = os.environ.get("EBB_METADATA_URL")
        self._signal = int(os.environ.get("EBB_DRAIN_SIGNAL", signal.SIGTERM))
        if install_signal and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self._signal, self._on_signal)
        self._thread = threading.Thread(target=self._poll, name="ebb-drain-watcher", daemon=True)
        self._thread.start()

    # -- what jobs call ---------------------------------------------------

    def drain_requested(self) -> bool:
        return self._event.is_set()

    def notice(self) -> Optional[Notice]:
        """The notice, once drained; read from the file when the signal came
        first, so the deadline is known wherever the job learnt of it."""
        with self._lock:
            if self._notice is not None and self._notice.source == "signal":
                found = self._read_file()
                if found is not None:
                    self._notice = found
            return self._notice

    def on_drain(self, callback: Callable[[Notice], None]) -> None:
        """Calls `callback(notice)` once, from the watcher's thread, when
        the drain comes (at once if it already has)."""
        fire = False
        with self._lock:
            if self._event.is_set():
                fire = True
            else:
                self._callbacks.append(callback)
        if fire:
            callback(self.notice())

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the drain comes or `timeout` passes."""
        return self._event.wait(timeout)

    # -- sources ----------------------------------------------------------

    def _on_signal(self, signum, frame):
        self._fire(Notice({"action": "preempt", "reason": f"signal {signum}"}, "signal"))
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def _read_file(self) -> Optional[Notice]:
        if not self._drain_file:
            return None
        try:
            with open(self._drain_file, "r", encoding="utf-8") as f:
                return Notice(json.load(f), "file")
        except (OSError, ValueError):
            return None

    def _read_endpoint(self) -> Optional[Notice]:
        if not self._url:
            return None
        try:
            with urllib.request.urlopen(self._url.rstrip("/") + "/ebb/v1/notice", timeout=2) as resp:
                return Notice(json.loads(resp.read().decode("utf-8")), "metadata")
        except urllib.error.HTTPError:
            return None  # 404: no notice yet
        except (OSError, ValueError):
            return None

    def _poll(self) -> None:
        while not self._event.is_set():
            found = self._read_file() or self._read_endpoint()
            if found is not None:
                self._fire(found)
                break
            self._event.wait(self._poll_interval)
        # Callbacks run here, never inside the signal handler.
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self.notice())
            except Exception as e:  # a job's callback must not kill the watcher silently
                print(f"ebb_sdk: drain callback failed: {e!r}", file=sys.stderr)

    def _fire(self, notice: Notice) -> None:
        with self._lock:
            if self._notice is None or self._notice.source == "signal":
                self._notice = notice
        self._event.set()


_default: Optional[DrainWatcher] = None
_default_lock = threading.Lock()


def watcher() -> DrainWatcher:
    """The process's watcher, created on first use: call this (or any of the
    functions below) early on the main thread so the signal handler is in
    place before a notice can come."""
    global _default
    with _default_lock:
        if _default is None:
            _default = DrainWatcher()
        return _default


def drain_requested() -> bool:
    return watcher().drain_requested()


def notice() -> Optional[Notice]:
    return watcher().notice()


def on_drain(callback: Callable[[Notice], None]) -> None:
    watcher().on_drain(callback)
