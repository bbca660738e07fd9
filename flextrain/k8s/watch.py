"""A stoppable, self-healing watch over Kubernetes objects, as plain dicts.

``ObjectWatch`` runs a list-function of the ``kubernetes`` client with
``watch=True`` in a daemon thread and calls ``handler(event_type, obj)`` for
every event (``ADDED``, ``MODIFIED``, ``DELETED``; ``obj`` is the raw JSON
dict, never a client model, so unknown fields survive). When the stream ends
or breaks it reconnects after a short back-off; a reconnect replays the
current objects as ``ADDED``, so handlers must be level-triggered (decide
from the object's state, not from the event type alone). ``stop()`` closes the
open stream, so the thread ends promptly instead of at the next event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Handler = Callable[[str, dict], None]


class ObjectWatch:
    def __init__(self, list_fn: Callable[..., Any], *args: Any, handler: Handler, name: str,
                 retry_interval: float = 0.5, **kwargs: Any) -> None:
        self._list_fn, self._args, self._kwargs = list_fn, args, kwargs
        self._handler = handler
        self.retry_interval = retry_interval
        self._stopped = threading.Event()
        self._response = None
        self._lock = threading.Lock()
        self.connected = threading.Event()  # set once the first stream is open
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{name}")

    def start(self) -> ObjectWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        while not self._stopped.is_set():
            try:
                resp = self._list_fn(*self._args, watch=True, _preload_content=False, **self._kwargs)
                with self._lock:
                    self._response = resp
                if self._stopped.is_set():
                    resp.close()
                    return
                self.connected.set()
                for line in iter_resp_lines(resp):
                    if self._stopped.is_set():
                        return
                    event = json.loads(line)
                    kind = event.get("type")
                    if kind == "ERROR":
                        log.warning("watch error event: %s", event.get("object", {}).get("message"))
                        break
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._dispatch(kind, event["object"])
            except Exception as exc:  # noqa: BLE001 - a broken stream is normal: reconnect
                if self._stopped.is_set():
                    return
                log.debug("watch stream ended (%s); reconnecting", exc)
            finally:
                with self._lock:
                    resp, self._response = self._response, None
                if resp is not None:
                    with contextlib.suppress(Exception):  # already closed by stop()
                        resp.release_conn()
            self._stopped.wait(self.retry_interval)

    def _dispatch(self, kind: str, obj: dict) -> None:
        try:
            self._handler(kind, obj)
        except Exception:
            log.exception("watch handler failed on %s %s", kind, obj.get("metadata", {}).get("name"))

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stopped.set()
        with self._lock:
            resp = self._response
        if resp is not None:
            try:
                resp.shutdown()  # unblocks the reading thread
            except Exception:  # noqa: BLE001 - older urllib3 has no shutdown(): close instead
                with contextlib.suppress(Exception):
                    resp.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
