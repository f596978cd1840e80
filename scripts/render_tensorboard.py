#!/usr/bin/env python
"""Screenshot a run's TensorBoard dashboards, opened from the links the run prints.

Starts this Python's TensorBoard on the run's ``tb/`` (``python -m tensorboard.main --logdir
RUN/tb --host 127.0.0.1 --port <free port>``: bound to the loopback address only), waits
until it lists every run of the folder (within ``--deadline`` seconds), opens each printed
link (``alm_opacus.report.tensorboard.dashboard_urls``) in headless Chromium, 1200 or 1400
pixels wide (:data:`VIEWS`), and stops TensorBoard. Each image is the browser window as the
link opens it, with no clicking: Custom Scalars (the trade-off chart first), Time Series
(the two trade-off cards) and HParams (the table of (method, ε) sessions).

Chromium is driven over the DevTools protocol on a pipe (no extra package), so each
screenshot waits, in real time, until the page has had no request in flight for a while:
TensorBoard fetches its data after the page loads, then draws.

Needs Debian's ``chromium`` (``apt-get install -y chromium``).

    .venv/bin/python scripts/render_tensorboard.py runs/latest [--update-docs]

With ``--update-docs`` the images go to ``docs/img/tensorboard/`` and the marked block
``tensorboard-shots`` of ``docs/reading_results.md`` shows them.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from chromium_shots import FLAGS, chromium, print_written, save_png, show_in_doc  # noqa: E402

from alm_opacus.report.tensorboard import dashboard_urls  # noqa: E402

DOC = ROOT / "docs" / "reading_results.md"
IMAGES = ROOT / "docs" / "img" / "tensorboard"
BLOCK = "tensorboard-shots"
#: What the images depend on besides this script (and the run folder rendered).
DEPS = (
    "alm_opacus/report/tensorboard.py",
    "alm_opacus/report/tb_runs.py",
    "alm_opacus/report/tb_hparams.py",
    "alm_opacus/report/tb_views.py",
    "alm_opacus/report/events.py",
    "scripts/chromium_shots.py",
)
HOST = "127.0.0.1"


@dataclass(frozen=True)
class View:
    """One screenshot: a printed link (a key of ``dashboard_urls``) in a window of
    ``width`` x ``height`` CSS pixels."""

    link: str
    stem: str
    width: int
    height: int
    caption: str


#: The screenshots, in the order shown. HParams is wider: its table gives every column at
#: least 10em, and the strongest attack's AUC comes after the four hparam columns.
VIEWS = (
    View(
        "custom scalars",
        "custom_scalars",
        1200,
        820,
        "Custom Scalars from the printed link: the trade-off first (the strongest attack's "
        "AUC against test accuracy ×1000, one line per method, the unprotected head one "
        "point)",
    ),
    View(
        "time series",
        "time_series",
        1200,
        900,
        "Time Series from the printed link: the two trade-off cards, one colour per method",
    ),
    View(
        "hparams",
        "hparams",
        1400,
        760,
        "HParams from the printed link: one session per (method, ε), with ε′, the "
        "guarantee, the method and the weak flag, then the strongest attack's AUC",
    ),
)
#: A page is drawn once no request has been in flight for this long (seconds), and it has
#: had at least MIN_WAIT_S since the navigation; at most PAGE_DEADLINE_S in all.
QUIET_S = 2.5
MIN_WAIT_S = 4.0
PAGE_DEADLINE_S = 60.0
#: The requests waited for: the page and TensorBoard's data fetches (a worker's script is
#: fetched for the worker, whose end this page's session never reports).
_DATA = ("Document", "XHR", "Fetch")
#: Run as ``python -c _TRAMPOLINE IN OUT COMMAND...``: COMMAND with fd IN as its fd 3 and
#: fd OUT as its fd 4 (each first moved above both, so neither move overwrites the other).
_TRAMPOLINE = """
import fcntl, os, sys
given = [int(fd) for fd in sys.argv[1:3]]
ends = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in given]
for fd in given:
    os.close(fd)
for target, fd in zip((3, 4), ends):
    os.dup2(fd, target)
for fd in ends:
    os.close(fd)
os.execv(sys.argv[3], sys.argv[3:])
"""


def free_port() -> int:
    """A TCP port free on the loopback address now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def expected_runs(logdir: Path) -> set[str]:
    """The runs TensorBoard lists for ``logdir``: every folder holding an events file,
    relative to ``logdir`` (``.`` for ``logdir`` itself)."""
    return {p.parent.relative_to(logdir).as_posix() for p in logdir.rglob("events.out.tfevents.*")}


def listed_runs(base: str) -> list[str] | None:
    """The runs TensorBoard at ``base`` lists, in its order; ``None`` while it does not
    answer."""
    try:
        with urllib.request.urlopen(f"{base}/data/runs", timeout=5) as response:
            return list(json.load(response))
    except (OSError, ValueError):
        return None


def wait_for_runs(
    base: str, runs: set[str], *, deadline_s: float, alive: Callable[[], bool] = lambda: True
) -> list[str]:
    """Poll TensorBoard at ``base`` until it lists every run of ``runs``.

    Args:
        base: its address.
        runs: the runs to wait for (:func:`expected_runs`).
        deadline_s: how long to wait, in seconds.
        alive: whether the server still runs (polling stops when it says no).

    Returns:
        The runs it lists, in its order.

    Raises:
        TimeoutError: when ``deadline_s`` seconds pass first.
        RuntimeError: when ``alive`` says the server stopped.
    """
    stop = time.monotonic() + deadline_s
    listed: list[str] | None = None
    while time.monotonic() < stop:
        listed = listed_runs(base)
        if listed is not None and runs <= set(listed):
            return listed
        if not alive():
            raise RuntimeError(f"TensorBoard at {base} stopped before it listed the runs")
        time.sleep(0.5)
    missing = sorted(runs - set(listed or []))
    raise TimeoutError(
        f"TensorBoard at {base} did not list {len(missing)} run(s) within {deadline_s:g} s: "
        f"{', '.join(missing[:5])}"
    )


@contextlib.contextmanager
def serving(logdir: Path, *, deadline_s: float = 90.0) -> Iterator[tuple[str, list[str]]]:
    """TensorBoard on ``logdir``, bound to 127.0.0.1 at a free port, until the block ends.

    Yields:
        Its address (``http://127.0.0.1:<port>``) and the runs it lists, in its order.

    Raises:
        TimeoutError: when it does not list every run of ``logdir`` within ``deadline_s``.
        RuntimeError: when it exits first (with the end of its output).
    """
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--host",
        HOST,
        "--port",
        str(port),
        "--reload_interval",
        "0",
    ]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://{HOST}:{port}"
            try:
                listed = wait_for_runs(
                    base,
                    expected_runs(logdir),
                    deadline_s=deadline_s,
                    alive=lambda: server.poll() is None,
                )
            except RuntimeError as exc:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{exc} (exit status {server.returncode}):\n{tail}") from None
            yield base, listed
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe
    (``--remote-debugging-pipe``: commands in on fd 3, replies out on fd 4, each a JSON
    message ended by a NUL byte), so that a screenshot waits for the page to finish
    loading and drawing in real time, with no extra package.

    Args:
        profile: a throw-away profile folder.

    Raises:
        SystemExit: when Chromium is not installed.
    """

    def __init__(self, profile: Path) -> None:
        to_child, self._to_browser = os.pipe()
        self._from_browser, from_child = os.pipe()
        command = [chromium(), *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}"]
        # a Python trampoline moves the child's pipe ends to fds 3 and 4 (whatever their
        # numbers: the shell's redirections stop at fd 9), then becomes Chromium
        self._process = subprocess.Popen(
            [sys.executable, "-c", _TRAMPOLINE, str(to_child), str(from_child), *command],
            pass_fds=(to_child, from_child),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._last_id = 0
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        """Ask Chromium to quit, then end it if it does not within 10 s."""
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            self.send("Browser.close", timeout_s=5)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pump(self, timeout_s: float) -> list[dict[str, Any]]:
        """The messages that arrive within ``timeout_s`` (none if none do)."""
        ready, _, _ = select.select([self._from_browser], [], [], max(timeout_s, 0.0))
        if ready:
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        messages = []
        while b"\0" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\0", 1)
            messages.append(json.loads(raw))
        return messages

    def send(
        self,
        method: str,
        params: Mapping[str, object] | None = None,
        *,
        session: str | None = None,
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        """Send one DevTools command and return its result (events that arrive meanwhile
        are kept for :meth:`events`).

        Raises:
            RuntimeError: when the command fails.
            TimeoutError: when no reply comes within ``timeout_s``.
        """
        self._last_id += 1
        message: dict[str, object] = {"id": self._last_id, "method": method}
        message["params"] = dict(params or {})
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        stop = time.monotonic() + timeout_s
        while time.monotonic() < stop:
            for reply in self._pump(stop - time.monotonic()):
                if reply.get("id") != self._last_id:
                    self._events.append(reply)
                elif "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                else:
                    return dict(reply["result"])
        raise TimeoutError(f"{method}: no reply within {timeout_s:g} s")

    def events(self, timeout_s: float) -> list[dict[str, Any]]:
        """The events kept so far and those that arrive within ``timeout_s``."""
        found = [m for m in self._pump(timeout_s) if "id" not in m]
        out, self._events = [*self._events, *found], []
        return out

    def screenshot(self, url: str, *, width: int, height: int) -> bytes:
        """Open ``url`` in a fresh ``width`` x ``height`` page and return a PNG of it once the
        page is drawn: no request in flight for :data:`QUIET_S` seconds, and at least
        :data:`MIN_WAIT_S` after the navigation (at most :data:`PAGE_DEADLINE_S`).

        Raises:
            TimeoutError: when the page keeps loading past the deadline.
        """
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        session = str(attached["sessionId"])
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics, session=session)
        self.send("Network.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        start = last = time.monotonic()
        in_flight: set[object] = set()
        while True:
            now = time.monotonic()
            if not in_flight and now - last >= QUIET_S and now - start >= MIN_WAIT_S:
                break
            if now - start > PAGE_DEADLINE_S:
                raise TimeoutError(f"{url} still loading after {PAGE_DEADLINE_S:g} s")
            for event in self.events(0.25):
                params = event.get("params") or {}
                method, request = event.get("method"), params.get("requestId")
                if method == "Network.requestWillBeSent" and params.get("type") in _DATA:
                    in_flight.add(request)
                elif method in ("Network.loadingFinished", "Network.loadingFailed"):
                    in_flight.discard(request)
                else:
                    continue
                last = time.monotonic()
        shot = self.send("Page.captureScreenshot", {"format": "png"}, session=session)
        self.send("Target.closeTarget", {"targetId": target})
        return base64.b64decode(str(shot["data"]))


def screenshot(browser: Browser, url: str, path: Path, *, width: int, height: int) -> Path:
    """``browser``'s screenshot of ``url`` in a ``width`` x ``height`` window, saved to
    ``path`` palette-quantised (to stay small)."""
    image = Image.open(io.BytesIO(browser.screenshot(url, width=width, height=height)))
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_png(image, path, colors=256)


def render(run: Path, out: Path, *, deadline_s: float = 90.0) -> list[Path]:
    """Screenshot every view of :data:`VIEWS` for ``run``'s ``tb/`` into ``out``.

    Returns:
        The PNG files written, in :data:`VIEWS` order.
    """
    written = []
    with (
        serving(run / "tb", deadline_s=deadline_s) as (base, _),
        tempfile.TemporaryDirectory() as profile,
        Browser(Path(profile)) as browser,
    ):
        for k, view in enumerate(VIEWS):
            path = out / f"tensorboard_{k + 1}_{view.stem}.png"
            url = dashboard_urls(base)[view.link]
            written.append(screenshot(browser, url, path, width=view.width, height=view.height))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder holding tb/")
    parser.add_argument("--out", default=None, help=f"image folder (default {IMAGES})")
    parser.add_argument(
        "--deadline",
        type=float,
        default=90.0,
        help="seconds to wait for TensorBoard to list every run",
    )
    parser.add_argument(
        "--update-docs", action="store_true", help=f"show the images in {DOC.relative_to(ROOT)}"
    )
    args = parser.parse_args(argv)
    if not (Path(args.run) / "tb").is_dir():
        parser.error(f"{Path(args.run) / 'tb'} does not exist: expected a finished run folder")
    chromium()  # fail before starting TensorBoard
    out = Path(args.out) if args.out else IMAGES
    written = render(Path(args.run), out, deadline_s=args.deadline)
    print_written(written)
    if args.update_docs:
        show_in_doc(
            DOC,
            block=BLOCK,
            script=__file__,
            run=args.run,
            args=[],
            intro="Rendered by `scripts/render_tensorboard.py` (TensorBoard on 127.0.0.1, "
            "headless Chromium), each from its printed link with no clicking:",
            images=[(p, view.caption) for p, view in zip(written, VIEWS, strict=True)],
            deps=DEPS,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
