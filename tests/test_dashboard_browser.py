"""The dashboard in a real headless Chromium: a real uvicorn API process, real workers, real Redis and MariaDB.

It submits a run from the page, watches it live, SIGKILLs the worker holding it, and must see the
takeover arrive on the page over the overview's WebSocket (text that exists only after the kill).
Screenshots go to $FENCED_SCREENSHOTS (docs/ to refresh the committed ones), else to a temporary folder:
a test run leaves the tree as it found it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from checkpoints import api_keys
from fencing import events, faults
from tests.workers_fixture import wait_for, wait_terminal

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get("FENCED_SCREENSHOTS") or tempfile.mkdtemp(prefix="fenced-shots-"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
XSS = '<img src=x onerror="window.__xss=1">'

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("FENCED_REQUIRE_BROWSER"):
        raise RuntimeError("chromium and chromium-driver are required: apt-get install -y chromium chromium-driver")
    pytest.skip("no chromium/chromedriver (apt-get install -y chromium chromium-driver)", allow_module_level=True)

from selenium import webdriver  # noqa: E402  (after the skip: selenium is a test extra)
from selenium.webdriver.common.by import By  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ApiServer:
    """A real `uvicorn fenced_api.app:create_app` process on a free port (this process's environment),
    which a test may kill and start again on the same port (the page's URLs stay valid)."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "api.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "fenced_api.app:create_app", "--factory",
                                          "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
                                         cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.base + "/dashboard", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the API did not start: " + self.log_path.read_text())
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: the process dies with its connections open (no close frame reaches a client)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def serve_api(tmp_path: Path) -> Iterator[str]:
    """A running ApiServer for the block; its base URL."""
    server = ApiServer(tmp_path)
    try:
        server.start()
        yield server.base
    finally:
        server.stop()


@pytest.fixture
def api(mysql_store: str, tmp_path: Path) -> Iterator[str]:
    with serve_api(tmp_path) as base:
        yield base


@pytest.fixture
def browser() -> Iterator[Any]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1300"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: Any, what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    """Poll the page (the DOM, not the API) until `check` is truthy; fail naming `what` and the page text."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # an element re-rendered between find and read: look again
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            body = driver.find_element(By.TAG_NAME, "body").text
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; the page shows:\n{body[:3000]}")
        time.sleep(0.1)


def read(driver: Any, selector: str) -> str:
    """The text of the element at `selector`, read again when the page re-rendered it between find and read."""
    return until(driver, f"the text of {selector}",
                 lambda: driver.find_element(By.CSS_SELECTOR, selector).text or None, 10)


def use_key(driver: Any, base: str, key: str, view: str = "#/") -> None:
    driver.get(base + "/dashboard" + view)
    driver.find_element(By.ID, "key-input").send_keys(key)
    driver.find_element(By.ID, "key-save").click()


def worker_row(driver: Any, pid: int) -> list[str]:
    """The workers table's cells for the process `pid` of this host ([] when it is not listed)."""
    name = f"{socket.gethostname().replace(' ', '_')}:{pid}"
    for tr in driver.find_elements(By.CSS_SELECTOR, "#workers tbody tr"):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        if cells and cells[0] == name:
            return cells
    return []


def show(driver: Any, selector: str) -> None:
    """Scroll the list holding `selector` (not the page) so that element is in view (for a screenshot)."""
    driver.execute_script("const li = document.querySelector(arguments[0]);"
                          "li.parentElement.scrollTop = li.offsetTop - li.parentElement.offsetTop - 80;", selector)


def run_row(driver: Any, run_id: str) -> dict[str, str] | None:
    rows = driver.find_elements(By.CSS_SELECTOR, f'#runs tr[data-run="{run_id}"]')
    if not rows:
        return None
    cells = rows[0].find_elements(By.TAG_NAME, "td")
    names = ["run", "user", "agent", "state", "step", "epoch", "owner", "lease", "input"]
    return {n: c.text for n, c in zip(names, cells, strict=True)}


def feed_types(driver: Any, run_id: str) -> list[str]:
    items = driver.find_elements(By.CSS_SELECTOR, "#feed li")
    return [li.get_attribute("data-type") for li in items
            if li.find_elements(By.CSS_SELECTOR, f'a[title="{run_id}"]')]


def test_dashboard_shows_a_takeover_live(workers, api, browser):
    key = api_keys.issue("ops", admin=True)
    workers.start("a")
    workers.start("b")
    use_key(browser, api, key)
    until(browser, "the overview to go live", lambda: browser.find_element(By.ID, "live-status").text == "live")

    # Submit from the page; the step hangs at the fault point, after its tools, before checkpoint B.
    faults.arm("after_tools")
    browser.find_element(By.ID, "submit-input").send_keys(XSS + " buy running shoes")
    browser.find_element(By.CSS_SELECTOR, "#submit-form button").click()
    run_id = until(browser, "the submitted run's id",
                   lambda: browser.find_element(By.ID, "submit-result").get_attribute("data-run"))
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    victim = workers.by_pid(hit[2])

    # Live, before the kill: epoch 1, running, its tool events in the feed, a lease counting down.
    row = until(browser, "the run running under epoch 1",
                lambda: (r := run_row(browser, run_id)) and r["state"] == "running" and r["epoch"] == "1" and r)
    until(browser, "its lease counting down", lambda: run_row(browser, run_id)["lease"].endswith(" s"), 5)
    until(browser, "the run's tool result in the feed", lambda: "tool_result" in feed_types(browser, run_id))
    assert "task_resumed" not in feed_types(browser, run_id)
    # The user's input is data: shown literally, never parsed as HTML.
    assert XSS in row["input"], row
    assert not browser.find_elements(By.CSS_SELECTOR, "#runs img, #feed img")
    assert browser.execute_script("return window.__xss === undefined")
    until(browser, "the holder in the workers table, alive, one run in flight, no renew failure",
          lambda: worker_row(browser, victim.pid)[1:4] == ["alive", "1", "0"], 10)

    # A second tab follows the run's own page (its live stream) through the kill.
    overview_tab = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(f"{api}/dashboard#/run/{run_id}")
    until(browser, "the run page following the live stream",
          lambda: browser.find_element(By.ID, "events-live").text == "live"
          and browser.find_elements(By.CSS_SELECTOR, "#run-events li.tool_result"))
    assert read(browser, '#run-facts dd[data-fact="epoch"]') == "1"
    assert not browser.find_elements(By.CSS_SELECTOR, "#run-events li.task_resumed")
    run_tab = browser.current_window_handle

    victim.kill(signal.SIGKILL)

    # Only a live page can show these: they exist in the stores only after the kill.
    until(browser, "task_resumed on the run page",
          lambda: browser.find_elements(By.CSS_SELECTOR, "#run-events li.task_resumed"), 40)
    resumed = read(browser, "#run-events li.task_resumed")
    assert "TAKEOVER: resumed by epoch 2 at step 0 from checkpoint 'decided'" in resumed, resumed
    [run] = wait_terminal([run_id], timeout=40)
    assert run.state == "done"
    until(browser, "the run page's end", lambda: browser.find_element(By.ID, "run-state").text == "done", 20)
    # Each later step is a claim of its own: the page shows the row's last epoch.
    until(browser, "the run page's last epoch",
          lambda: browser.find_element(By.CSS_SELECTOR, '#run-facts dd[data-fact="epoch"]').text == str(run.epoch))
    # The half-step the crash threw away (its tool events after checkpoint A) is struck through, and
    # the replay shows once more under epoch 2.
    assert browser.find_elements(By.CSS_SELECTOR, "#run-events li.superseded.tool_result")
    until(browser, "the ledger's takeover row", lambda: browser.find_elements(By.CSS_SELECTOR, "#ledger tr.takeover"))
    until(browser, "the explanation of the two workers",
          lambda: browser.find_elements(By.CSS_SELECTOR, '#explain div[data-topic="workers"] p'))
    steps = read(browser, "#steps")
    assert "decided" in steps and "done" in steps, steps
    assert XSS in read(browser, '#run-facts dd[data-fact="input"]')
    assert browser.execute_script("return window.__xss === undefined")

    browser.switch_to.window(overview_tab)
    until(browser, "task_resumed in the overview's live feed", lambda: "task_resumed" in feed_types(browser, run_id))
    resumed = until(browser, "the feed's task_resumed lines",
                    lambda: [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#feed li.task_resumed")])
    assert any("TAKEOVER: resumed by epoch 2" in t for t in resumed), resumed
    until(browser, "the run done in the runs table",
          lambda: (r := run_row(browser, run_id)) and r["state"] == "done" and r["epoch"] == str(run.epoch), 20)
    until(browser, "the takeover counted",
          lambda: browser.find_element(By.CSS_SELECTOR, '#counters div[data-counter="takeovers seen"] b').text == "1")
    until(browser, "the run counted done",
          lambda: browser.find_element(By.CSS_SELECTOR, '#counters div[data-counter="runs done"] b').text == "1")
    until(browser, "the killed worker shown presumed dead, holding nothing",
          lambda: worker_row(browser, victim.pid)[1].startswith("presumed dead")
          and worker_row(browser, victim.pid)[2] == "0", 20)
    show(browser, "#feed li.task_resumed")
    browser.save_screenshot(str(SHOTS / "dashboard-overview.png"))
    browser.switch_to.window(run_tab)
    show(browser, "#run-events li.task_resumed")
    browser.save_screenshot(str(SHOTS / "dashboard-takeover.png"))


def shown_eids(driver: Any, selector: str) -> list[str]:
    """The data-eid of each event line at `selector`, in page order."""
    return until(driver, f"the event lines of {selector}",
                 lambda: [li.get_attribute("data-eid") for li in driver.find_elements(By.CSS_SELECTOR, selector)],
                 10)


def test_the_page_reconnects_and_resynchronises_after_the_api_restarts(workers, mysql_store, tmp_path, browser):
    """The API process dies mid-run (SIGKILL) while the overview and a run page are open; the run goes on
    on its worker (its steps, then its question) with no API to tell the page. The API comes back on the
    same port: the overview is live again from a new snapshot, the run page resumes after the last
    event it was shown and gets what it missed; the run then completes, and every event line of the
    run shows once on both."""
    from tasks import service, submit_run

    key = api_keys.issue("ops", admin=True)
    server = ApiServer(tmp_path)
    server.start()
    try:
        use_key(browser, server.base, key)
        until(browser, "the overview to go live", lambda: browser.find_element(By.ID, "live-status").text == "live")
        overview_tab = browser.current_window_handle
        # "[ask]": the run asks a question at step 1 and waits, so its stream is still open when the API is back.
        run_id = submit_run("alice", "buy headphones [ask]")
        browser.switch_to.new_window("tab")
        browser.get(f"{server.base}/dashboard#/run/{run_id}")
        until(browser, "the run page's snapshot of the queued run",
              lambda: browser.find_element(By.ID, "events-live").text == "live"
              and shown_eids(browser, "#run-events li") == ["run:queued"], 30)
        run_tab = browser.current_window_handle
        # Started only now: every event of the run's first step reaches the page live, after its snapshot,
        # so the page's resume point is an event it was sent, not the snapshot's last one.
        workers.start("a", FENCED_STUB_STEP_MS="1500")
        until(browser, "the first step's tool result, live",
              lambda: browser.find_elements(By.CSS_SELECTOR, "#run-events li.tool_result"), 30)
        assert service.get_run(run_id).state == "running"
        stored_at_kill = len(events.read(run_id))

        server.kill()
        until(browser, "the run page no longer live",
              lambda: browser.find_element(By.ID, "events-live").text == "not live", 10)
        browser.switch_to.window(overview_tab)
        until(browser, "the overview offline", lambda: browser.find_element(By.ID, "live-status").text == "offline", 10)
        # Without the API the run goes on: steps done, then its question (nothing left to tell the page).
        wait_for(lambda: service.get_run(run_id).state == "waiting", 60, "the run to ask its question")
        missed = len(events.read(run_id)) - stored_at_kill
        assert missed > 0, "events were appended while the API was down"
        assert not browser.find_elements(By.CSS_SELECTOR, "#feed li.run_waiting"), "shown before the API was back"

        server.start()
        until(browser, "the overview live again", lambda: browser.find_element(By.ID, "live-status").text == "live", 20)
        until(browser, "the overview's new snapshot: the run waiting",
              lambda: (r := run_row(browser, run_id)) and r["state"] == "waiting", 20)
        browser.switch_to.window(run_tab)
        until(browser, "the run page live again, with the question it missed",
              lambda: browser.find_element(By.ID, "events-live").text == "live"
              and browser.find_elements(By.CSS_SELECTOR, "#run-events li.run_waiting"), 20)
        assert shown_eids(browser, "#run-events li") == [e.eid for e in events.live_view(events.read(run_id))]

        service.reply(run_id, "any brand", by="alice", user_id="alice")
        [run] = wait_terminal([run_id], timeout=60)
        assert run.state == "done", run
        until(browser, "the run page's end", lambda: browser.find_element(By.ID, "run-state").text == "done"
              and browser.find_elements(By.CSS_SELECTOR, "#run-events li.run_done"), 20)
        until(browser, "the stream ended", lambda: browser.find_element(By.ID, "events-live").text == "ended", 10)
        page = shown_eids(browser, "#run-events li")
        assert len(page) == len(set(page)), f"an event line shown twice on the run page: {page}"
        assert page == [e.eid for e in events.live_view(events.read(run_id))], "the page is the run's live view"
        steps_done = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#run-events li.step_done")]
        stored = [e.step for e in events.read(run_id) if e.type == "step_done"]
        assert len(steps_done) == len(stored) == len(set(stored)) >= 3, (steps_done, stored)  # each step once
        assert all(f" s{n} step {n} done" in text for n, text in zip(stored, steps_done, strict=True)), steps_done

        browser.switch_to.window(overview_tab)
        until(browser, "the run done in the overview",
              lambda: (r := run_row(browser, run_id)) and r["state"] == "done", 20)
        until(browser, "the run's end in the overview's feed", lambda: "run_done" in feed_types(browser, run_id), 20)
        # The feed is the raw stream, newest first (a replayed step's events are recorded, and shown, again):
        # each stored event once, none the reconnection doubled.
        feed = [li.get_attribute("data-eid") for li in browser.find_elements(By.CSS_SELECTOR, "#feed li")
                if li.find_elements(By.CSS_SELECTOR, f'a[title="{run_id}"]')]
        assert feed == [e.eid for e in reversed(events.read(run_id))], "the overview's feed is the run's stream"
        assert feed_types(browser, run_id).count("run_waiting") == 1
    finally:
        server.stop()


def test_overview_needs_an_admin_key_and_a_run_page_is_the_callers(api, browser):
    from tasks import submit_run

    theirs = submit_run("mallory", "someone else's run")
    mine = submit_run("alice", XSS)
    key = api_keys.issue("alice")
    use_key(browser, api, key)
    until(browser, "the admin notice", lambda: "needs an admin key" in browser.find_element(By.ID, "notice").text)
    # Her own runs only, listed once (GET /api/runs), her input shown literally.
    row = until(browser, "alice's run listed", lambda: run_row(browser, mine))
    assert row["input"] == XSS and row["state"] == "queued", row
    assert run_row(browser, theirs) is None
    assert len(browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")) == 1
    assert browser.execute_script("return window.__xss === undefined")
    browser.get(f"{api}/dashboard#/run/{theirs}")
    until(browser, "another user's run refused as missing",
          lambda: "404" in browser.find_element(By.ID, "notice").text)
    assert "someone else's run" not in browser.find_element(By.TAG_NAME, "body").text
    answer = httpx.get(f"{api}/api/dashboard/runs/{theirs}", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 404, answer.text


# -- routing (issue 14): the worker panel's live scores, and why a run went where it went ----------------

def routing_rows(driver: Any) -> dict[str, dict[str, str]]:
    """The routing table: worker name -> its cells by column (and its row's classes)."""
    names = ["worker", "status", "score", "freshness", "speed", "load", "success", "qualifies"]
    out = {}
    for tr in driver.find_elements(By.CSS_SELECTOR, "#routing tbody tr"):
        cells = dict(zip(names, (td.text for td in tr.find_elements(By.TAG_NAME, "td")), strict=True))
        out[tr.get_attribute("data-worker")] = {**cells, "class": tr.get_attribute("class")}
    return out


def test_dashboard_shows_each_workers_routing_score_live(settings_env, workers, mysql_store, tmp_path, browser):
    """Under FENCED_ROUTING=reach (short registry intervals: offline 2 s after the last beat): the routing
    panel lists both workers with their score and four factors, as pushed by the overview socket; they
    change as the workers run steps, a frozen worker turns offline and not qualified, and comes back
    when it thaws; a run's page answers why it went to its worker."""
    import re

    from tasks import submit_run

    settings_env(routing="reach", routing_heartbeat_ms=500, routing_scan_ms=250, max_runs_per_user=100)
    key = api_keys.issue("ops", admin=True)
    workers.start("a")
    frozen = workers.start("b")
    with serve_api(tmp_path) as base:
        use_key(browser, base, key)
        until(browser, "the overview to go live", lambda: browser.find_element(By.ID, "live-status").text == "live")
        rows = until(browser, "both workers scored and qualified",
                     lambda: (r := routing_rows(browser)) and len(r) == 2
                     and all(x["qualifies"] == "yes" for x in r.values()) and r)
        node_b = next(n for n in rows if n.startswith("b@"))
        assert "policy reach, threshold 0.3" in read(browser, "#routing-policy")
        for row in rows.values():
            assert 0.3 <= float(row["score"]) <= 1.0, row
            assert re.fullmatch(r"\d\.\d\d \(\d+\.\d s\)", row["freshness"]), row
            assert re.fullmatch(r"\d\.\d\d \(\d+ running \+ \d+ queued\)", row["load"]), row
            assert row["status"] == "online" and "not-qualified" not in row["class"], row

        # Runs go to both (the idle one scores higher): each worker's speed factor now has a step behind it.
        ids = [submit_run(f"u{i}", "buy headphones") for i in range(6)]
        wait_terminal(ids, timeout=60)
        rows = until(browser, "each worker's average step time shown",
                     lambda: (r := routing_rows(browser)) and all("no step yet" not in x["speed"] for x in r.values())
                     and r, 15)
        assert all(re.fullmatch(r"0\.\d\d \(\d+\.\d\d s\)", x["speed"]) for x in rows.values()), rows

        # Frozen: its freshness decays, then the scan marks it offline; the page says it no longer qualifies.
        frozen.kill(signal.SIGSTOP)
        try:
            row = until(browser, "the frozen worker offline and not qualified",
                        lambda: (r := routing_rows(browser).get(node_b)) and r["status"] == "offline" and r, 15)
            assert row["qualifies"] == "no: offline" and "not-qualified" in row["class"], row
            assert float(row["freshness"].split()[0]) < 0.05, row  # over 3 periods without a beat
            browser.save_screenshot(str(SHOTS / "dashboard-routing.png"))
        finally:
            frozen.kill(signal.SIGCONT)
        until(browser, "the thawed worker online and qualified again",
              lambda: (r := routing_rows(browser).get(node_b)) and r["status"] == "online" and r["qualifies"] == "yes",
              15)

        # A run's page says why it went to the worker it went to (the `routed` ledger entries, via explain).
        browser.get(f"{base}/dashboard#/run/{ids[0]}")
        why = until(browser, "the routing answer on the run page",
                    lambda: browser.find_element(By.CSS_SELECTOR, '#explain div[data-topic="routed"]').text)
        assert "Why did it go to the worker it went to?" in why, why
        assert re.search(r"submit wake-up for step 0 routed to [ab]@\S+ \(score \d\.\d\d: freshness", why), why
        assert "continuation wake-up" in why, why
