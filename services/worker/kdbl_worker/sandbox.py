"""Extraction in child processes: a per-file time limit, a memory cap, and crashes that stay contained.

Parsers written in C (pdfium, lxml, …) can spin on a pathological file, allocate without bound or
crash the interpreter; pdfium is not thread-safe either. So files are opened, extracted and chunked
in a few long-lived child processes (`python -c …`, independent of the worker's own modules and
threads; they exit within a second of the worker's death), never in the worker itself:

- each child caps its address space with `RLIMIT_AS` (`memory_mb`); a MemoryError becomes the file's
  status "failed: extraction ran out of memory (limit N MB)" and the child is replaced;
- a file still running after `timeout_s` gets the child killed (SIGKILL) and the status
  "failed: extraction timed out after N s"; a child that dies otherwise gives "extraction crashed …";
- a child is replaced after `max_tasks_per_child` files (slow leaks in native libraries stay bounded);
- a child's environment holds no secret (no database URL, tokens or source credentials);
- every child has the next file waiting in its pipe (`depth`), so it extracts file n+1 while the
  worker writes file n: on the common small text file the process hop costs little wall time.

`processes=0` extracts in the calling process (no limits; for debugging and tools).

`run(stop=...)` notices a stop within `STOP_POLL_S` (0.2 s) even while a child works on a long file:
children that still hold tasks are killed and the caller hands those back. `on_start` is told when a
task begins in a child (the worker's heartbeat stamps that file as in hand: see kdbl_worker.queue).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from types import SimpleNamespace
from typing import Any, BinaryIO

from kdbl_worker.chunking import DEFAULT_MAX, DEFAULT_TARGET
from kdbl_worker.extract.base import Sidecar

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_MAX_TASKS = 1000
STARTUP_TIMEOUT_S = 120.0
STOP_POLL_S = 0.2
# OCR stops reading pages after this share of the per-file timeout: a long scan ends `partial` with the
# pages read so far instead of being killed at the timeout with none of them
OCR_BUDGET_SHARE = 0.75
# A container stops extracting members after this share of the per-file timeout (the file and all its members
# share it): a zip of slow members ends `partial` with those read so far instead of `failed` with none
CONTAINER_BUDGET_SHARE = 0.75
_EXAMPLES = 5  # members with problems of their own named one by one in their container's reason


def default_processes() -> int:
    """One extractor child per core (at most 8): extraction is the crawl's CPU work, PostgreSQL's share
    is mostly its own analysis of the text; each child keeps its own memory cap and time limit."""
    return max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int | None = DEFAULT_MEMORY_MB
    chunk_target: int = DEFAULT_TARGET
    chunk_max: int = DEFAULT_MAX
    transcriber_model: str | None = None  # not a limit: the extraction setting children need (media.py)
    # OCR of images and scanned PDF pages (extract/ocr.py): `ocr` is the source's switch (Task.ocr sets it
    # per file), `ocr_max_pages` per file (KDBL_OCR_MAX_PAGES); OCR stops after OCR_BUDGET_SHARE of timeout_s
    ocr: bool = True
    ocr_max_pages: int = 200
    # archives and e-mails: their members become child files (extract/containers.py, KDBL_CONTAINER_*)
    container_max_depth: int = 3
    container_max_members: int = 1000
    container_max_member_bytes: int = 64 << 20
    container_max_expanded_bytes: int = 512 << 20


@dataclass(slots=True)
class Task:
    """One file to extract: a local `path` to open, an `opener` (picklable: the fs connector's, which opens
    beneath the source's root in the child), or its bytes in `data`. `ref` is the caller's."""

    ref: Any
    name: str
    size: int
    path: str | None = None
    opener: Callable[[], BinaryIO] | None = None
    data: bytes | None = None
    sidecar: Sidecar | None = None  # the subtitle file paired with a media file
    ocr: bool = True  # the source's `ocr` config key: False leaves images and scanned pages unread


@dataclass(slots=True)
class Outcome:
    status: str
    reason: str | None
    title: str | None
    content_type: str | None
    text_chars: int
    # (seq, text, char_start, char_end, page_no, ts_start_ms, ts_end_ms, context_header): Chunk's fields up
    # to its text_tokens, which the worker counts (kdbl_worker.token_counts: no tokenizer in the children)
    chunks: list[tuple] = field(default_factory=list)
    recycle: bool = False
    children: list[Child] = field(default_factory=list)  # a container's members, each extracted like a file
    authors: list[str] = field(default_factory=list)  # the document's own properties (Extraction.authors)
    tags: list[str] = field(default_factory=list)  # its own labels (Markdown front matter `tags`)
    # a container's problems with its members, its members' members included (`_expand`): what makes every
    # level above it `partial` too
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0  # how long its extraction took (the sandbox measures it; the per-file deadline covers it)

    @classmethod
    def failed(cls, reason: str, content_type: str | None = None) -> Outcome:
        return cls("failed", reason, None, content_type, 0, [])


@dataclass(slots=True)
class Child:
    """A member of a container file (an archive entry, an e-mail attachment): its path inside the parent
    (the child's key is the parent's + containers.MEMBER_SEP + path), its size, and its own outcome
    (with children of its own when the member is a container too)."""

    path: str
    size: int
    outcome: Outcome


@dataclass(slots=True)
class _Nesting:
    """Where a member sits: the bounds and the budget shared by every level of one top-level file."""

    bounds: Any
    budget: Any
    depth: int
    deadline: float  # time.monotonic() by which members stop being extracted (CONTAINER_BUDGET_SHARE)


def _names(values: list[str]) -> list[str]:
    """Authors or tags as stored: cleaned, stripped, first occurrence of each, at most 64 of 200 chars."""
    out = dict.fromkeys(clean(v).strip()[:200] for v in values if isinstance(v, str))
    return [v for v in out if v][:64]


def clean(value: str) -> str:
    """Postgres text holds neither NUL nor lone surrogates; keep offsets by mapping 1:1."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def extract_and_chunk(name: str, size: int, stream: BinaryIO, limits: Limits,
                      sidecar: Sidecar | None = None, *, nesting: _Nesting | None = None) -> Outcome:
    """Extract one file and cut it into chunks (what a child does; also the in-process path); a container's
    members become `Outcome.children`, extracted the same way (`_expand`)."""
    started = time.monotonic()
    from kdbl_worker import extract
    from kdbl_worker.chunking import chunk_blocks

    content_type, _ = extract.detect(name)
    nesting = nesting or _top(limits, started)
    try:
        result = extract.extract(extract.Source(stream, name, size, content_type, sidecar=sidecar,
                                                transcriber_model=limits.transcriber_model, ocr=limits.ocr,
                                                ocr_max_pages=limits.ocr_max_pages,
                                                ocr_budget_s=limits.timeout_s * OCR_BUDGET_SHARE,
                                                bounds=nesting.bounds, budget=nesting.budget))
        for block in result.blocks:
            block.text = clean(block.text)
        full_text, chunks = chunk_blocks(result.blocks, target=limits.chunk_target, max_chars=limits.chunk_max,
                                         lines=extract.formats.line_structured(result.content_type))
    except MemoryError:
        return _out_of_memory(limits, content_type)
    if result.status == "failed" and (result.reason or "").startswith("MemoryError"):
        return _out_of_memory(limits, result.content_type or content_type)
    outcome = Outcome(result.status, result.reason, clean(result.title) if result.title else None,
                      result.content_type or content_type, len(full_text),
                      [(c.seq, c.text, c.char_start, c.char_end, c.page_no, c.ts_start_ms, c.ts_end_ms,
                        clean(c.context_header) if c.context_header else None) for c in chunks],
                      authors=_names(result.authors), tags=_names(result.tags))
    try:
        return _expand(outcome, name, stream, nesting,
                       lambda member, size, data, inner, left: extract_and_chunk(
                           member, size, data, replace(limits, timeout_s=left / OCR_BUDGET_SHARE),
                           nesting=inner))
    except MemoryError:
        if nesting.depth:
            raise
        return _out_of_memory(limits, outcome.content_type)


def _top(limits: Limits, started: float) -> _Nesting:
    """The bounds and the fresh budget of a top-level file that started at `started` (monotonic)."""
    from kdbl_worker.extract import containers

    bounds = containers.Bounds(
        max_depth=limits.container_max_depth, max_members=limits.container_max_members,
        max_member_bytes=limits.container_max_member_bytes,
        max_expanded_bytes=limits.container_max_expanded_bytes)
    return _Nesting(bounds, containers.Budget(), 0, started + limits.timeout_s * CONTAINER_BUDGET_SHARE)


def _lifted(children: list[Child]) -> list[str]:
    """The problems of members that are containers themselves, one line per member (`_EXAMPLES`, then
    counted): a member refused two levels down makes every level above it `partial` with the reason."""
    out, more = [], 0
    for child in children:
        if child.outcome.problems:
            if len(out) < _EXAMPLES:
                first, rest = child.outcome.problems[0], len(child.outcome.problems) - 1
                out.append(f"{child.path}: {first[:300]}" + (f" (+{rest} more)" if rest else ""))
            else:
                more += 1
    if more:
        out.append(f"... and {more} more members with problems of their own")
    return out


def _expand(outcome: Outcome, name: str, stream: BinaryIO, nesting: _Nesting,
            again: Callable[[str, int, BinaryIO, _Nesting, float], Outcome]) -> Outcome:
    """A container's members, one level at a time, each extracted by `again` (with the same flags as
    its parent). One Budget per top-level file bounds the members and bytes of all levels together;
    members nested deeper than `container_max_depth` are not expanded. A refused member becomes a
    `skipped` child with the reason; the container's own problems, and those of the containers among
    its members (at any depth), make it `partial` with the reasons (`Outcome.problems`). Members stop at
    `nesting.deadline` (CONTAINER_BUDGET_SHARE of the timeout), and a member's own OCR budget is what is
    left of it."""
    import io

    from kdbl_worker.extract import containers

    if not containers.is_container(name):
        return outcome
    problems: list[str] = []
    if nesting.depth >= nesting.bounds.max_depth:
        problems.append(f"members not expanded: nested deeper than {nesting.bounds.max_depth} levels "
                        "(KDBL_CONTAINER_MAX_DEPTH)")
    else:
        inner = _Nesting(nesting.bounds, nesting.budget, nesting.depth + 1, nesting.deadline)
        try:
            stream.seek(0)
            expansion = containers.expand(name, stream, nesting.bounds, nesting.budget)
            for member in expansion.members:
                left = nesting.deadline - time.monotonic()
                if member.data is None:
                    child = Outcome("skipped", member.problem or "member refused", None,
                                    _content_type(member.path), 0)
                elif left <= 0:
                    problems.append(
                        f"stopped at {member.path} after {len(outcome.children)} members: the time for "
                        f"members ({CONTAINER_BUDGET_SHARE:.0%} of KDBL_EXTRACT_TIMEOUT_S, for the file and "
                        "all its members) was spent; the rest are not indexed")
                    break
                else:
                    child = again(member.path, member.size, io.BytesIO(member.data), inner, left)
                outcome.children.append(Child(member.path, member.size, child))
            getattr(expansion.members, "close", lambda: None)()  # a generator: its last problems now
            problems.extend(expansion.problems)
            problems.extend(_lifted(outcome.children))
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken container is the file's status, never a crash
            log.warning("container expansion failed", extra={"file": name, "error": repr(exc)[:300]})
            problems.append(f"members could not be read: {type(exc).__name__}: {str(exc)[:300]}")
    if problems:
        outcome.problems = problems
        if outcome.status == "ok" or (outcome.status == "skipped" and outcome.children):
            outcome.status = "partial"
        outcome.reason = "; ".join(([outcome.reason] if outcome.reason else []) + problems)[:2000]
    elif outcome.status == "skipped" and outcome.children:  # no text of its own, but its members have some
        outcome.status, outcome.reason = "ok", None
    return outcome


def _out_of_memory(limits: Limits, content_type: str | None) -> Outcome:
    outcome = Outcome.failed(f"extraction ran out of memory (limit {limits.memory_mb} MB)", content_type)
    outcome.recycle = True
    return outcome


def run_task(task: Task, limits: Limits) -> Outcome:
    import io

    from kdbl_worker import extract

    if not task.ocr:
        limits = replace(limits, ocr=False)  # members of an archive follow their file's source
    if task.data is not None:
        return extract_and_chunk(task.name, task.size, io.BytesIO(task.data), limits, task.sidecar)
    try:
        stream = task.opener() if task.opener is not None else open(task.path or "", "rb")  # noqa: SIM115
    except OSError as exc:
        return Outcome.failed(f"cannot read file: {exc.strerror or exc}", extract.detect(task.name)[0])
    with stream:
        return extract_and_chunk(task.name, task.size, stream, limits, task.sidecar)


def _child_main(conn: Connection, limits: Limits) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when children stop
    # imported before "ready": start-up time is no file's time
    for module in ("kdbl_worker.chunking", "kdbl_worker.extract", "kdbl_worker.extract.containers"):
        importlib.import_module(module)

    if limits.memory_mb:
        cap = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        outcome = run_task(task, limits)
        conn.send((outcome, time.monotonic()))
        if outcome.recycle:
            return


def _child_entry() -> None:
    """`python -c "from kdbl_worker.sandbox import _child_entry; _child_entry()" FD_IN FD_OUT LIMITS`."""
    parent = os.getppid()

    def orphaned() -> None:  # die with the worker, whatever kills it (kill -9 included)
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.stack_size(256 * 1024)
    threading.Thread(target=orphaned, name="orphan-watch", daemon=True).start()
    tasks = Connection(int(sys.argv[1]), writable=False)
    results = Connection(int(sys.argv[2]), readable=False)
    limits = pickle.loads(bytes.fromhex(sys.argv[3]))

    _child_main(SimpleNamespace(recv=tasks.recv, send=results.send), limits)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Child:
    proc: subprocess.Popen
    tasks: Connection
    conn: Connection  # results
    queue: deque = field(default_factory=deque)  # tasks sent, oldest (running) first
    head_started: float = 0.0
    sent: int = 0


class Sandbox:
    def __init__(self, processes: int | None = None, limits: Limits | None = None, *,
                 max_tasks_per_child: int = DEFAULT_MAX_TASKS, depth: int = 2) -> None:
        self.processes = default_processes() if processes is None else processes
        self.limits = limits or Limits()
        self.max_tasks = max_tasks_per_child
        self.depth = max(1, depth)
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._on_start: Callable[[Task], None] | None = None

    # -- children -------------------------------------------------------------------------------
    def _spawn(self) -> _Child:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from kdbl_worker.sandbox import _child_entry; _child_entry()",
                 str(task_r), str(result_w), pickle.dumps(self.limits).hex()],
                pass_fds=(task_r, result_w), stdin=subprocess.DEVNULL, close_fds=True, env=_child_env())
        finally:
            os.close(task_r)
            os.close(result_w)
        child = _Child(proc, Connection(task_w, readable=False), Connection(result_r, writable=False))
        try:
            if not child.conn.poll(STARTUP_TIMEOUT_S) or child.conn.recv() != "ready":
                raise OSError("no ready message")
        except (OSError, EOFError) as exc:
            self._retire(child, kill=True)
            raise RuntimeError(f"extraction process did not start (exit code {proc.returncode})") from exc
        return child

    def _retire(self, child: _Child, *, kill: bool) -> None:
        if child in self._children:
            self._children.remove(child)
        if kill:
            child.proc.kill()
        else:
            try:
                child.tasks.send(None)
            except OSError:
                pass
        try:
            child.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait(timeout=5)
        child.tasks.close()
        child.conn.close()

    def start(self) -> None:
        """Start the children now (otherwise the first file waits for them)."""
        with self._lock:
            while len(self._children) < self.processes:
                self._children.append(self._spawn())

    def close(self) -> None:
        with self._lock:
            for child in list(self._children):
                self._retire(child, kill=bool(child.queue))

    # -- running tasks ----------------------------------------------------------------------------
    def run(self, tasks: Iterable[Task], *, stop: threading.Event | None = None,
            on_start: Callable[[Task], None] | None = None) -> Iterator[tuple[Task, Outcome]]:
        """Extract `tasks`, yielding (task, outcome) as they finish (not in order).

        Tasks are taken from the iterable only as children have room, so the caller may produce them
        lazily. Closing the generator early (or setting `stop`) kills children that still hold tasks;
        tasks taken but not yielded are the caller's to put back.
        """
        if not self.processes:
            for task in tasks:
                if stop is not None and stop.is_set():
                    return
                if on_start is not None:
                    on_start(task)
                began = time.monotonic()
                outcome = run_task(task, self.limits)
                outcome.seconds = time.monotonic() - began
                yield task, outcome
            return
        with self._lock:  # one run at a time: the stop and on_start below are this run's
            self._stop, self._on_start = stop, on_start
            try:
                yield from self._run(iter(tasks))
            finally:
                self._stop = self._on_start = None

    def _started(self, task: Task) -> None:
        if self._on_start is not None:
            self._on_start(task)

    def _run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, Outcome]]:
        backlog: deque[Task] = deque()
        exhausted = False
        try:
            while True:
                if self._stop is not None and self._stop.is_set():
                    return
                exhausted = self._dispatch(tasks, backlog, exhausted)
                busy = [c for c in self._children if c.queue]
                if not busy:
                    if exhausted and not backlog:
                        return
                    continue
                yield from self._collect(busy, backlog)
        finally:
            for child in [c for c in self._children if c.queue]:  # closed early: drop unfinished work
                self._retire(child, kill=True)

    def _dispatch(self, tasks: Iterator[Task], backlog: deque[Task], exhausted: bool) -> bool:
        while len(self._children) < self.processes:
            self._children.append(self._spawn())
        for child in list(self._children):
            while len(child.queue) < self.depth and child.sent < self.max_tasks:
                if backlog:
                    task = backlog.popleft()
                elif exhausted:
                    break
                else:
                    task = next(tasks, None)
                    if task is None:
                        exhausted = True
                        break
                try:
                    child.tasks.send(task)
                except OSError:  # the child is gone; its tasks go back to the backlog
                    backlog.appendleft(task)
                    backlog.extendleft(reversed(child.queue))
                    self._retire(child, kill=True)
                    break
                if not child.queue:
                    child.head_started = time.monotonic()
                    self._started(task)
                child.queue.append(task)
                child.sent += 1
            if child.sent >= self.max_tasks and not child.queue:
                self._retire(child, kill=False)  # recycled; replaced on the next dispatch
        return exhausted

    def _collect(self, busy: list[_Child], backlog: deque[Task]) -> Iterator[tuple[Task, Outcome]]:
        timeout = self.limits.timeout_s
        now = time.monotonic()
        wait_for = max(0.0, min(c.head_started + timeout for c in busy) - now)
        if self._stop is not None:
            wait_for = min(wait_for, STOP_POLL_S)
        ready = wait([c.conn for c in busy], timeout=wait_for)  # a dead child's pipe reads as EOF
        for child in busy:
            if child.conn in ready:
                try:
                    outcome, finished = child.conn.recv()
                except (EOFError, OSError):
                    yield from self._crashed(child, backlog)
                    continue
                task = child.queue.popleft()
                outcome.seconds = max(0.0, finished - child.head_started)
                child.head_started = finished
                if child.queue:
                    self._started(child.queue[0])
                if outcome.recycle:
                    backlog.extendleft(reversed(child.queue))
                    child.queue.clear()
                    self._retire(child, kill=False)
                yield task, outcome
            elif time.monotonic() >= child.head_started + timeout:
                task = child.queue.popleft()
                backlog.extendleft(reversed(child.queue))
                child.queue.clear()
                self._retire(child, kill=True)
                log.warning("extraction timed out", extra={"file": task.name, "timeout_s": timeout})
                reason = f"extraction timed out after {timeout:g} s"
                outcome = Outcome.failed(reason, _content_type(task.name))
                outcome.seconds = timeout
                yield task, outcome

    def _crashed(self, child: _Child, backlog: deque[Task]) -> Iterator[tuple[Task, Outcome]]:
        task = child.queue.popleft()
        backlog.extendleft(reversed(child.queue))
        child.queue.clear()
        self._retire(child, kill=True)
        code = child.proc.returncode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        log.warning("extraction crashed", extra={"file": task.name, "how": how})
        yield task, Outcome.failed(f"extraction crashed ({how})", _content_type(task.name))


# Children parse untrusted files: they get no database URL, tokens or source credentials.
_ENV_KEPT = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV")


def _child_env() -> dict[str, str]:
    from kdbl_core.settings import child_env  # the parent's side only: children need not import pydantic

    return child_env(keep=lambda k: k in _ENV_KEPT or k.startswith(("LC_", "PYTHON")))


def _content_type(name: str) -> str | None:
    from kdbl_worker import extract

    return extract.detect(name)[0]


_shared: dict[tuple, Sandbox] = {}
_shared_lock = threading.Lock()


def shared(processes: int | None = None, limits: Limits | None = None) -> Sandbox:
    """One sandbox per configuration and process, started on first use and closed at exit."""
    limits = limits or Limits()
    key = (default_processes() if processes is None else processes, limits)
    with _shared_lock:
        box = _shared.get(key)
        if box is None:
            box = _shared[key] = Sandbox(key[0], limits)
        return box


@atexit.register
def close_shared() -> None:
    """Close the shared sandboxes (their child processes end); the next `shared()` starts afresh."""
    with _shared_lock:
        boxes = list(_shared.values())
        _shared.clear()
    for box in boxes:
        box.close()
