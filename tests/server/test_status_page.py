"""The status page at `/`, loaded in a real headless browser (Chromium): it lists the
batches of the queue with their progress, and asks for the API key when it has none."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from queue_helpers import specq, start_worker, stop_process, wait_until
from server_helpers import KEY, get

BROWSER = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def browse(url: str, *args: str) -> str:
    """The page's DOM (or Chromium's output, with --screenshot) after its script ran."""
    if BROWSER is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium); the status page is not checked")
    proc = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=4000", *args, url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_page_is_plain_and_its_data_needs_the_key(server):
    url, _ = server
    status, html = get(url + "/")
    assert status == 200 and "<table>" in html and "/status.js" in html
    assert get(url + "/status.js")[0] == 200
    assert get(url + "/v1/specq/status")[0] == 401


@pytest.mark.slow
def test_the_page_lists_the_batches_and_their_progress(server, api, tmp_path, long_model_path):
    url, env = server
    lines = tmp_path / "b.jsonl"
    lines.write_text("".join(json.dumps({"custom_id": f"r{i}", "prompt": f"item {i}"}) + "\n" for i in range(5)))
    specq(["submit", str(lines), "--batch-id", "nightly-one", "--model", long_model_path, "--max-tokens", "8"], env)
    worker = start_worker(env, "--burst")
    try:
        wait_until(lambda: worker.poll() is not None, 120, "the burst worker to finish the batch")
    finally:
        stop_process(worker)
    specq(["submit", str(lines), "--batch-id", "later-one", "--model", long_model_path, "--max-tokens", "8"], env)
    specq(["pause", "later-one"], env)

    dom = browse(f"{url}/#key={KEY}", "--dump-dom")
    rows = {row.split('"')[0]: row for row in dom.split('<tr data-batch="')[1:]}
    assert set(rows) == {"nightly-one", "later-one"}
    assert (
        ">completed<" in rows["nightly-one"] and ">5/5<" in rows["nightly-one"] and "width: 100%" in rows["nightly-one"]
    )
    assert ">paused<" in rows["later-one"] and ">0/5<" in rows["later-one"]
    assert KEY not in dom  # the key left the address bar and the page

    dom = browse(url + "/", "--dump-dom")
    assert "needs its API key" in dom and "nightly-one" not in dom
    dom = browse(url + "/#key=wrong", "--dump-dom")
    assert "that key was refused" in dom and "nightly-one" not in dom

    shot = tmp_path / "status.png"
    browse(f"{url}/#key={KEY}", "--hide-scrollbars", "--window-size=1100,300", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
