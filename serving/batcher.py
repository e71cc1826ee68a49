"""The batcher: one thread that owns the backend, groups requests that arrive together, and swaps
weights between batches.

Continuous batching: while a batch runs, requests that arrive join it between decode steps (up to
``max_batch_size`` rows), and each request's result is delivered as soon as its own choices finish.
A pending reload stops new requests from joining, so the running batch drains and the swap happens.

Both HTTP routes and in-process callers go through ``submit``; weight updates go through ``reload``
and take effect after the batch in flight, so no request is dropped and every result says which
policy version produced it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Any

from spanrl.errors import ServingError
from spanrl.lifecycle import Lifecycle, State
from spanrl.serving.backend import Backend, Completion, GenerationRequest, GenerationResult

__all__ = ["Batcher", "QueueFullError"]

_logger = logging.getLogger(__name__)


class QueueFullError(ServingError):
    """More requests are waiting than ``max_queue_size``; retry later (HTTP 503)."""


@dataclasses.dataclass
class _Job:
    request: GenerationRequest
    future: concurrent.futures.Future[GenerationResult]


@dataclasses.dataclass
class _Reload:
    source: Any
    future: concurrent.futures.Future[int]
    adapter: str | None = None


@dataclasses.dataclass
class _Call:
    """Something the batcher thread runs between batches (it owns the backend), e.g. the backend's ``sleep``."""

    fn: Any
    future: concurrent.futures.Future[Any]


_STOP = object()


class Batcher:
    """Runs ``backend.generate`` on batches of up to ``max_batch_size`` sequences (requests x n)."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_batch_size: int = 32,
        max_batch_delay_ms: float = 2.0,
        max_queue_size: int = 4096,
    ) -> None:
        self.backend = backend
        self.max_batch_size = max_batch_size
        self.max_batch_delay_s = max_batch_delay_ms / 1000.0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue_size)
        self._carry: collections.deque[Any] = collections.deque()
        self._thread: threading.Thread | None = None
        # policy version per adapter (None: the base); each reload bumps only its own
        self._versions: dict[str | None, int] = {None: 0, **{n: 0 for n in getattr(backend, "adapter_names", ())}}
        self._lock = threading.Lock()
        self._life = Lifecycle("batcher", ServingError)

    @property
    def version(self) -> int:
        """Policy version of the base model: 0 for the weights loaded at start, +1 per reload."""
        return self.version_of(None)

    def version_of(self, adapter: str | None) -> int:
        """Policy version of ``adapter`` (None: the base): 0 when loaded at start or added by a reload, +1 per
        later reload of it (so a Trainer that adds its adapters to a server it did not start agrees on them)."""
        with self._lock:
            return self._versions[adapter]

    @property
    def adapters(self) -> dict[str, int]:
        """The LoRA adapters served, name -> version."""
        with self._lock:
            return {name: v for name, v in self._versions.items() if name is not None}

    def start(self) -> None:
        """Start the batcher thread (idempotent)."""
        if self._life.begin(again=True):
            self._thread = threading.Thread(target=self._loop, name="spanrl-batcher", daemon=True)
            self._thread.start()

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        """Queue a request; the future resolves to its result or to the error that failed it."""
        self._life.refuse("submit to", State.STOPPED)
        future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
        try:
            self._queue.put_nowait(_Job(request, future))
        except queue.Full:
            raise QueueFullError(f"{self._queue.maxsize} requests are already waiting; retry later") from None
        return future

    def reload_async(self, source: Any, adapter: str | None = None) -> concurrent.futures.Future[int]:
        """Queue a weight swap (path, state_dict or module) of the base, or of ``adapter`` (added when new);
        the future resolves to the new version of what was swapped."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        if threading.current_thread() is self._thread:
            self._apply_reload(_Reload(source, future, adapter))
        else:
            self._queue.put(_Reload(source, future, adapter))
        return future

    def reload(self, source: Any, timeout: float | None = None, adapter: str | None = None) -> int:
        """Swap weights after the batch in flight and return the new version."""
        return self.reload_async(source, adapter).result(timeout)

    def call(self, fn: Any) -> concurrent.futures.Future[Any]:
        """Run ``fn()`` on the batcher thread after the batch in flight; the future resolves to its result."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put(_Call(fn, future))
        return future

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Finish queued work, then stop the thread. Safe before start and twice."""
        if not self._life.end():
            return
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout)

    # --- the thread -------------------------------------------------------------------------------
    def _next(self, timeout: float | None) -> Any:
        if self._carry:
            return self._carry.popleft()
        if timeout is None:
            return self._queue.get()
        if timeout <= 0:
            return self._queue.get_nowait()
        return self._queue.get(timeout=timeout)

    def _loop(self) -> None:
        while True:
            item = self._next(None)
            if item is _STOP:
                return
            if isinstance(item, _Reload):
                self._apply_reload(item)
                continue
            if isinstance(item, _Call):
                _run_call(item)
                continue
            batch, other = [item], []  # other: jobs of other adapters, first in line after this batch
            size = item.request.n
            deadline = time.monotonic() + self.max_batch_delay_s
            while size < self.max_batch_size:
                try:
                    nxt = self._next(deadline - time.monotonic())
                except queue.Empty:
                    break
                if isinstance(nxt, _Job) and nxt.request.adapter != item.request.adapter:
                    other.append(nxt)  # one adapter per batch: never a forward pass with another's adapter
                    continue
                if not isinstance(nxt, _Job) or size + nxt.request.n > self.max_batch_size:
                    other.append(nxt)  # a reload or stop waits for this batch; a big job for the next
                    break
                batch.append(nxt)
                size += nxt.request.n
            self._carry.extendleft(reversed(other))
            self._run(batch)

    def _run(self, batch: list[_Job]) -> None:
        jobs = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not jobs:
            return
        adapter = jobs[0].request.adapter
        version = self.version_of(adapter)
        run = getattr(self.backend, "run", None)
        if run is None:  # a backend without continuous batching
            self._run_whole(jobs, version)
            return
        inflight = {id(job.request): job for job in jobs}
        seen = len(jobs)
        hold = False  # a reload or stop is waiting: let the running batch drain

        def on_done(request: GenerationRequest, completions: list[Completion], batch_size: int) -> None:
            job = inflight.pop(id(request))
            job.future.set_result(GenerationResult(request.prompt_ids, completions, batch_size, version, adapter))

        def admit(active_rows: int) -> list[GenerationRequest]:
            nonlocal hold, seen
            room = self.max_batch_size - active_rows
            joined: list[GenerationRequest] = []
            while room > 0 and not hold:
                try:
                    item = self._next(0)
                except queue.Empty:
                    break
                if not isinstance(item, _Job) or item.request.adapter != adapter:
                    self._carry.appendleft(item)  # a reload, a stop, or another adapter's job: drain, then it
                    hold = True
                elif item.request.n > room:
                    self._carry.appendleft(item)
                    break
                elif item.future.set_running_or_notify_cancel():
                    inflight[id(item.request)] = item
                    joined.append(item.request)
                    room -= item.request.n
                    seen += 1
            return joined

        try:
            run([job.request for job in jobs], on_done=on_done, admit=admit)
        except Exception as exc:  # noqa: BLE001 - one bad request must not fail the others
            left = list(inflight.values())
            if seen == 1:
                _logger.warning("generation failed: %s", exc)
                for job in left:
                    job.future.set_exception(_as_serving_error(exc))
                return
            _logger.warning("a batch failed (%s); retrying its %d unfinished requests one by one", exc, len(left))
            for job in left:
                self._run_alone(job, version)

    def _run_whole(self, jobs: list[_Job], version: int) -> None:
        try:
            results = self.backend.generate([job.request for job in jobs])
        except Exception as exc:  # noqa: BLE001
            if len(jobs) == 1:
                jobs[0].future.set_exception(_as_serving_error(exc))
                return
            for job in jobs:
                self._run_alone(job, version)
            return
        size = sum(job.request.n for job in jobs)
        for job, completions in zip(jobs, results):
            result = GenerationResult(job.request.prompt_ids, completions, size, version, job.request.adapter)
            job.future.set_result(result)

    def _run_alone(self, job: _Job, version: int) -> None:
        try:
            completions = self.backend.generate([job.request])[0]
        except Exception as exc:  # noqa: BLE001
            job.future.set_exception(_as_serving_error(exc))
            return
        job.future.set_result(GenerationResult(job.request.prompt_ids, completions, job.request.n, version,
                                                  job.request.adapter))

    def _apply_reload(self, item: _Reload) -> None:
        if not item.future.set_running_or_notify_cancel():
            return
        try:
            if item.adapter is None:
                self.backend.load_weights(item.source)
            else:
                self.backend.load_weights(item.source, adapter=item.adapter)
        except Exception as exc:  # noqa: BLE001 - the caller gets it; serving goes on with the old weights
            item.future.set_exception(exc if isinstance(exc, ServingError) else ServingError(f"reload failed: {exc}"))
            return
        with self._lock:
            known = item.adapter in self._versions
            version = self._versions[item.adapter] = self._versions[item.adapter] + 1 if known else 0
        what = "weights" if item.adapter is None else f"adapter {item.adapter!r}"
        _logger.info("%s reloaded: policy version %d", what, version)
        item.future.set_result(version)


def _run_call(item: _Call) -> None:
    if item.future.set_running_or_notify_cancel():
        try:
            item.future.set_result(item.fn())
        except Exception as exc:  # noqa: BLE001 - the caller gets it
            item.future.set_exception(exc)


def _as_serving_error(exc: Exception) -> ServingError:
    return exc if isinstance(exc, ServingError) else ServingError(f"generation failed: {exc}")
