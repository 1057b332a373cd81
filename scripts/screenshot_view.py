"""Screenshot of a rollout tree of a run in `arpo view` (the README's figure): the first tree with a
branch in a tree whose rewards differ (else any branch, else the first tree) of the run's last saved
step, with the branch's path opened.

    .venv/bin/python scripts/screenshot_view.py runs/quickstart/arpo docs/figures/arpo_view_tree.png

Needs Debian's chromium + chromium-driver (scripts/install_browser.sh) and selenium (the `test` extra).
Prints the step, tree and path it drew."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    sys.exit("scripts/screenshot_view.py needs selenium: pip install -e .[test]")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1000"]


def _step(f: Path) -> int:
    return int(f.name.split("_")[1].split(".")[0])


def pick(run: Path) -> tuple[int, int, int]:
    """(step, tree index, trajectory id), latest step first: a branch in a tree whose rewards differ
    (something to learn from), else any branch, else a tree's first path."""
    files = sorted((run / "rollouts").glob("step_*.jsonl.gz"), key=_step, reverse=True)
    if not files:
        sys.exit(f"{run}: no saved rollouts (run.save_rollouts)")
    any_branch = None
    for f in files:
        with gzip.open(f, "rt") as fh:
            for tree in map(json.loads, fh):
                mixed = len({t["reward"] for t in tree["trajectories"]}) > 1
                for t in tree["trajectories"]:
                    if t["parent"] is not None:
                        if mixed:
                            return _step(f), tree["index"], t["id"]
                        any_branch = any_branch or (_step(f), tree["index"], t["id"])
    if any_branch:
        return any_branch
    with gzip.open(files[0], "rt") as fh:
        tree = json.loads(fh.readline())
    return _step(files[0]), tree["index"], tree["trajectories"][0]["id"]


def main(run: str, out: str) -> None:
    step, tree, traj = pick(Path(run))
    view = subprocess.Popen([sys.executable, "-m", "arpo", "view", run, "--port", "0"], stdout=subprocess.PIPE,
                            text=True)
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", view.stdout.readline()).group(0)
        opts = Options()
        opts.binary_location = "/usr/bin/chromium"
        for f in FLAGS:
            opts.add_argument(f)
        d = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=opts)
        try:
            d.get(url + f"#/tree?run=0&step={step}&tree={tree}")
            WebDriverWait(d, 60).until(lambda d: d.execute_script(
                "const m = document.getElementById('main'); return m && m.dataset.ready;") == "tree")
            d.find_element(By.CSS_SELECTOR, f'circle.leaf[data-traj="{traj}"]').click()
            WebDriverWait(d, 30).until(lambda d: d.find_element(By.CSS_SELECTOR, f'#path[data-traj="{traj}"]'))
            d.save_screenshot(out)
        finally:
            d.quit()
    finally:
        view.terminate()
        view.wait(30)
    print(f"{out}: step {step}, tree {tree}, path #{traj}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
