"""The chat page at / in a real headless browser: Chromium from Debian's packages (installed here if
it is missing and this is a Debian machine we may install on), driven over the DevTools protocol.
A message is sent and its answer streams in with the speed shown; a second one is stopped
mid-answer, and the server sees the request cancelled."""
import json
import os
import shutil
import subprocess
import time
from contextlib import ExitStack
from itertools import count

import httpx
import pytest
from helpers import LiveServer
from session_wrappers import EndlessSession, SlowSession

from nanocompile import Model
from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.server import create_app

pytestmark = pytest.mark.slow


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        r = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("no Chromium, and no apt-get to install Debian's as root")
    return found


class Browser:
    """Headless Chromium and one page, spoken to over the DevTools protocol's websocket."""

    def __init__(self, tmp_path):
        from websockets.sync.client import connect

        profile = tmp_path / "profile"
        self.process = subprocess.Popen([chromium_path(), "--headless", "--no-sandbox", "--disable-gpu",
                                         "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, end = profile / "DevToolsActivePort", time.time() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.time() < end and self.process.poll() is None, "Chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]
        self.stack = ExitStack()  # websockets wants its connection used as a context manager
        self.socket = self.stack.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=None))
        self.ids = count(1)

    def call(self, method: str, **params) -> dict:
        msg_id = next(self.ids)
        self.socket.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.socket.recv(timeout=60))
            if reply.get("id") == msg_id:
                assert "error" not in reply, reply
                return reply["result"]

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, seconds: float = 60):
        end = time.time() + seconds
        while not (value := self.js(expression)):
            assert time.time() < end, f"waited {seconds} s for {expression}"
            time.sleep(0.05)
        return value

    def close(self):
        self.stack.close()
        self.process.terminate()
        self.process.wait(30)


def test_the_chat_page_streams_an_answer_shows_its_speed_and_stops_one(tiny_chat_model, tmp_path):
    inner = InterpreterSession.from_weights(tiny_chat_model.config, tiny_chat_model.weights, n_ctx=256)
    # no answer ends early (a sampled end-of-text after two characters left nothing to stop)
    ends = Model.from_session(tiny_chat_model, inner).eos_token_ids
    assert ends
    session = SlowSession(EndlessSession(inner, ends), delay=0.03)
    server = LiveServer(create_app(Model.from_session(tiny_chat_model, session)))
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere: works offline
    browser = Browser(tmp_path)
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=server.url + "/")
        browser.wait_for("document.readyState === 'complete' && document.getElementById('model').textContent")

        def say(text: str) -> None:
            browser.js(f"document.getElementById('input').value = {json.dumps(text)};"
                       "document.getElementById('form').requestSubmit()")

        say("hello")  # the tiny model answers until its context is full: about 4 seconds here
        browser.wait_for("document.querySelectorAll('.assistant').length === 1 && "
                         "document.querySelector('.assistant').textContent.length > 0")
        status = browser.wait_for("document.getElementById('send').disabled === false && "
                                  "document.getElementById('status').textContent", seconds=120)
        assert "tokens/s" in status and "first after" in status, status
        answer = browser.js("document.querySelector('.assistant').textContent")
        assert answer and server.health()["requests"]["done"] == 1

        browser.js("document.getElementById('reset').click()")
        say("again")
        browser.wait_for("document.querySelector('.assistant') && "
                         "document.querySelector('.assistant').textContent.length > 3")
        browser.js("document.getElementById('stop').click()")
        assert browser.wait_for("document.getElementById('status').textContent === 'stopped' && "
                                "document.getElementById('send').disabled === false")
        end = time.time() + 30
        while (health := server.health())["busy"] or health["requests"]["cancelled"] < 1:
            assert time.time() < end, health
            time.sleep(0.05)
        assert health["requests"]["cancelled"] == 1 and health["requests"]["done"] == 1
    finally:
        browser.close()
        server.stop()
