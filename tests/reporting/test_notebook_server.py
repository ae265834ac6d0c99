"""start_notebook.sh for real: JupyterLab behind a token, the dashboard run in headless Chromium."""

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import ROOT

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM) or shutil.which("jupyter") is None,
                                reason="needs Debian's chromium and JupyterLab")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(url: str) -> int:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None
    try:
        return urllib.request.build_opener(NoRedirect).open(url, timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:
        return 0            # not listening (yet)


@pytest.fixture
def server(small_sweep, tmp_path):
    out, _ = small_sweep
    port, token = free_port(), "test-token-0123456789"
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(["bash", str(ROOT / "start_notebook.sh"), "--port", str(port), "--token", token,
                             "--threads", "1"], env={**os.environ, "AIO_RESULTS": str(out)}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and status(f"{base}/api/status?token={token}") != 200:
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        time.sleep(0.5)
    yield base, token, tmp_path
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    log.close()


def test_start_notebook_prints_the_url_and_refuses_requests_without_the_token(server):
    base, token, tmp_path = server
    assert status(f"{base}/api/contents?token={token}") == 200
    assert status(f"{base}/api/contents") == 403
    assert status(f"{base}/lab") in (302, 303)                    # to the login page
    printed = (tmp_path / "server.log").read_text()
    assert f"{base}/lab?token={token}" in printed and "ssh -N -L" in printed
    if os.getuid() == 0:
        assert "--allow-root" in printed


# The slow tier: JupyterLab and Chromium started for one page: the notebook server's token test stays in the default
# tier
@pytest.mark.slow
def test_the_dashboard_runs_in_a_real_browser_and_draws_a_plot(server):
    sync_api = pytest.importorskip("playwright.sync_api")
    base, token, tmp_path = server
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/lab/tree/notebooks/dashboard.ipynb?token={token}")
        try:
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)    # the kernel is up
            page.click("li.lm-MenuBar-item:has-text('Run')")
            page.click("li.lm-Menu-item:has-text('Run All Cells')")
            page.wait_for_selector(".jp-OutputArea-output img", state="attached", timeout=240_000)
            shown = page.locator(".jp-OutputArea-output img").count()
        finally:
            page.screenshot(path=str(tmp_path / "dashboard.png"))     # kept for a look when it fails
            browser.close()
    assert shown >= 1
