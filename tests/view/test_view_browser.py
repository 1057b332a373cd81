"""`arpo view` in a real headless browser (Debian's chromium + chromium-driver, driven by selenium):
the run page draws a tiny run's curves, a tree page shows a branch point after a tool result, and
clicking a path shows its tokens shaded by entropy. A screenshot of each page is saved as a test
artifact (pytest's tmp dir, and $ARPO_TEST_ARTIFACTS when set). CI installs the browser with
scripts/install_browser.sh; without it these tests skip, saying so."""

import contextlib
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (Path(CHROMIUM).is_file() and Path(DRIVER).is_file()):
    why = "chromium and chromium-driver are not installed (run scripts/install_browser.sh)"
    if os.environ.get("CI") == "true":  # CI must run these: .ci/run installs the browser first
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[test])")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1000"]


@contextlib.contextmanager
def view_server(run):
    """`arpo view RUN` in a subprocess: yields its URL."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-m", "arpo", "view", str(run), "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+/", line)
    if not m:
        p.kill()
        pytest.fail(f"arpo view did not start: {line}{p.stderr.read()}")
    try:
        yield m.group(0)
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tiny_run):
    with view_server(tiny_run) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for f in FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        opts.add_argument(f)
    d = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Saves a screenshot under pytest's tmp dir and, if ARPO_TEST_ARTIFACTS is set, copies it there."""
    out = tmp_path_factory.mktemp("screenshots")

    def save(driver, name):
        p = out / f"{name}.png"
        driver.save_screenshot(str(p))
        assert p.stat().st_size > 10_000  # a real picture, not a blank page
        if os.environ.get("ARPO_TEST_ARTIFACTS"):
            dest = Path(os.environ["ARPO_TEST_ARTIFACTS"])
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, dest / p.name)
        return p

    return save


def open_page(driver, url, page):
    # A hash change re-renders without reloading: the old <main> keeps its data-ready until replaced, so
    # clear it first, or the wait below passes at once and the next lookup finds a replaced element.
    # The same URL again fires no hashchange: reload it.
    same = driver.current_url == url
    driver.execute_script("const m = document.getElementById('main'); if (m) delete m.dataset.ready;")
    driver.refresh() if same else driver.get(url)
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "const m = document.getElementById('main'); return m && m.dataset.ready;") in (page, "error"))
    err = driver.find_elements(By.CSS_SELECTOR, "main .err")
    assert not err, err[0].text


def a_branched_tree(run):
    """(step, tree, a branch) of the run: a trajectory that forked from its parent."""
    for f in sorted((run / "rollouts").glob("step_*.jsonl.gz")):
        with gzip.open(f, "rt") as fh:
            for tr in map(json.loads, fh):
                for t in tr["trajectories"]:
                    if t["parent"] is not None:
                        return int(f.name.split("_")[1].split(".")[0]), tr, t
    raise AssertionError("no branch in the tiny run")


def test_run_page_shows_the_curves(server, browser, shots, tiny_run):
    open_page(browser, server + "#/run", "run")
    rows = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    panel = browser.find_element(By.CSS_SELECTOR, '.panel[data-panel="reward"]')
    path = panel.find_element(By.CSS_SELECTOR, 'path.series[data-series="reward_mean"]')
    assert path.get_attribute("d").count("L") == len(rows) - 1  # one vertex per logged step
    names = {p.get_attribute("data-panel") for p in browser.find_elements(By.CSS_SELECTOR, ".panel")}
    assert {"entropy: response start vs after tool results", "branch rate (branched / all trajectories)",
            "tool calls per trajectory, by tool", "KL", "clip fraction", "step time split (s)"} <= names
    # hover: the values of the step under the mouse
    overlay = panel.find_element(By.CSS_SELECTOR, "rect")
    ActionChains(browser).move_to_element(overlay).perform()
    tip = browser.find_element(By.ID, "tip")
    WebDriverWait(browser, 10).until(lambda d: tip.is_displayed())
    assert "reward_mean" in tip.text and re.search(r"step \d", tip.text)
    step = int(re.search(r"step (\d+)", tip.text).group(1))
    assert f"reward_mean: {rows[step - 1]['reward_mean']:.4g}"[:18] in tip.text
    shots(browser, "run")


def test_step_page_lists_the_trees(server, browser, shots):
    open_page(browser, server + "#/step?run=0&step=2", "step")
    cards = browser.find_elements(By.CSS_SELECTOR, ".tree-card")
    assert len(cards) == 2 and all(len(c.find_elements(By.CSS_SELECTOR, ".chip")) == 4 for c in cards)
    shots(browser, "step")


def test_tree_page_shows_a_branch_point_after_a_tool_result(server, browser, shots, tiny_run):
    step, tree, branch = a_branched_tree(tiny_run)
    open_page(browser, server + f"#/tree?run=0&step={step}&tree={tree['index']}", "tree")
    fork = browser.find_element(By.CSS_SELECTOR, f'circle.fork[data-traj="{branch["id"]}"]')
    k = int(fork.get_attribute("data-after-result"))
    parent = tree["trajectories"][branch["parent"]]
    assert k >= 0
    assert int(fork.get_attribute("data-pos")) == parent["tool_calls"][k]["result_span"][1] == branch["start"]
    # the branch decision the parent took there: drawn as branched, its ΔH and P in the tooltip
    mark = browser.find_element(By.CSS_SELECTOR, f'path.decision[data-traj="{parent["id"]}"][data-result="{k}"]')
    assert mark.get_attribute("data-branched") == "1" and "branched" in mark.get_attribute("class")
    tip = mark.find_element(By.TAG_NAME, "title").get_attribute("textContent")
    d = next(x for x in parent["decisions"] if x["tool_call_index"] == k)
    assert f"P(branch) = {d['probability']:.3g}"[:16] in tip and "ΔH" in tip
    # the tool result that precedes it is drawn on the parent's line, ending where the branch starts
    owner = parent["id"] if parent["tool_calls"][k]["result_span"][0] >= parent["start"] else parent["parent"]
    assert browser.find_elements(By.CSS_SELECTOR, f'rect.result[data-traj="{owner}"][data-result="{k}"]')
    leaves = browser.find_elements(By.CSS_SELECTOR, "circle.leaf")
    assert len(leaves) == len(tree["trajectories"])
    shots(browser, "tree")


def test_clicking_a_path_shows_its_tokens_shaded_by_entropy(server, browser, shots, tiny_run):
    step, tree, branch = a_branched_tree(tiny_run)
    open_page(browser, server + f"#/tree?run=0&step={step}&tree={tree['index']}", "tree")
    browser.find_element(By.CSS_SELECTOR, f'circle.leaf[data-traj="{branch["id"]}"]').click()
    path = f'#path[data-traj="{branch["id"]}"]'
    box = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.CSS_SELECTOR, path))
    toks = box.find_elements(By.CSS_SELECTOR, ".tok")
    parent = tree["trajectories"][branch["parent"]]
    own_gen = sum(branch["mask"])
    inherited_gen = sum(parent["mask"][: branch["start"] - parent["start"]]) if parent["parent"] is None else None
    if inherited_gen is not None:
        assert len(toks) == own_gen + inherited_gen  # every generated token of the whole path
    hs = [float(t.get_attribute("data-h")) for t in toks]
    alphas = [float(re.search(r"rgba\(240, 110, 20, ([\d.]+)\)", t.get_attribute("style")).group(1)) for t in toks]
    assert len(set(alphas)) > 3  # shaded, not uniform
    order = sorted(range(len(hs)), key=hs.__getitem__)
    # consecutive pairs in entropy order: more entropy, darker
    assert all(alphas[a] <= alphas[b] + 1e-9 for a, b in zip(order, order[1:], strict=False))
    assert "entropy" in toks[0].get_attribute("title") and "advantage" in toks[0].get_attribute("title")
    results = box.find_elements(By.CSS_SELECTOR, ".resultblock")
    assert len(results) == 2 and "391" in results[0].text and "python result 1" in results[0].text
    lines = box.find_elements(By.CSS_SELECTOR, ".decisionline")
    assert lines and all("ΔH" in x.text or "no branch decision" in x.text for x in lines)
    assert "this path is the branch" in box.text and "advantage" in box.text
    assert box.find_elements(By.CSS_SELECTOR, ".call")  # the tool calls are set apart
    shots(browser, "path")
    # the same path shaded by advantage
    from selenium.webdriver.support.ui import Select

    Select(box.find_element(By.ID, "shade")).select_by_value("advantage")
    tok = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.CSS_SELECTOR, "#path .tok"))
    assert re.search(r"rgba\((26, 152, 80|215, 48, 39)", tok.get_attribute("style"))


def test_entropy_page(server, browser, shots):
    open_page(browser, server + "#/entropy?run=0", "entropy")
    chart = browser.find_element(By.CSS_SELECTOR, '.panel[data-panel="entropy by position in the segment"]')
    names = {p.get_attribute("data-series") for p in chart.find_elements(By.CSS_SELECTOR, "path.series")}
    assert {"response start (initial)", "after any tool result"} <= names
    assert browser.find_elements(By.CSS_SELECTOR, '.panel[data-panel="first 20 tokens, per step"] path.series')
    shots(browser, "entropy")
    open_page(browser, server + "#/entropy?run=0&step=2", "entropy")
    assert "step 2" in browser.find_element(By.ID, "entropy-scope").get_attribute("innerHTML")


def test_exported_site_works_from_the_file_system(browser, shots, tiny_run, tmp_path):
    from arpo.view.data import Catalog
    from arpo.view.export import export_site

    site = tmp_path / "site"
    export_site(Catalog([str(tiny_run)]), site)
    open_page(browser, (site / "index.html").as_uri() + "#/run", "run")
    assert browser.find_elements(By.CSS_SELECTOR, '.panel[data-panel="reward"] path.series')
    step, tree, branch = a_branched_tree(tiny_run)
    open_page(browser, (site / "index.html").as_uri() + f"#/tree?run=0&step={step}&tree={tree['index']}", "tree")
    assert browser.find_elements(By.CSS_SELECTOR, "circle.fork")
    browser.find_element(By.CSS_SELECTOR, f'circle.leaf[data-traj="{branch["id"]}"]').click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#path .tok"))
    shots(browser, "export_tree")


def test_a_pause_with_several_json_tool_calls(browser, shots, tmp_path):
    """agent.tool_format: json — one pause, two <tool_call>s, one appended result block: the block is
    labelled with both tools, both calls are set apart, the decision after it is shown."""
    from arpo.training.rollout_log import tree_summary
    from arpo.view.data import Catalog
    from arpo.view.export import export_site

    head = ["I", " will", " call", "<tool_call>", '{"name": "echo"}', "</tool_call>", "<tool_call>",
            '{"name": "python"}', "</tool_call>"]
    result = ["<tool_response>", "olleh", "</tool_response>", "<tool_response>", "4", "</tool_response>"]
    tail = [" done", "<answer>", "4", "</answer>"]
    toks = head + result + tail
    n, b = len(toks), len(head) + len(result)

    def traj(i, parent, tokens, start):
        own = len(tokens)
        return {"id": i, "parent": parent, "branch_at": start or None, "reward": 1.0 - i, "correct": i == 0,
                "answer": "4", "format_error": None, "finish_reason": "answer", "n_tokens": start + own,
                "initial_entropy": 1.0, "step_entropies": [1.5], "tool_calls": [
                    {"tool": "echo", "input": "hello", "output": "olleh", "ok": True, "elapsed_s": 0.01,
                     "result_span": [0, 0]},
                    {"tool": "python", "input": "print(4)", "output": "4", "ok": True, "elapsed_s": 0.02,
                     "result_span": [len(head), b]}],
                "decisions": ([{"tool_call_index": 0, "delta_entropy": 0.5, "probability": 0.6, "branched": True}]
                              if i == 0 else []),
                "start": start, "tokens": tokens, "mask": [0 if len(head) <= start + j < b else 1 for j in range(own)],
                "entropy": [0.1 * (j % 7) for j in range(own)], "logp": [-0.5] * own,
                "advantage": [0.7 - i] * (start + own)}

    rec = {"format": "arpo-rollouts/1", "step": 1, "index": 0, "prompt_id": "json-1", "question": "echo then add",
           "gold": ["4"], "task": "math", "prompt": "p", "preset": "arpo", "attribution": "soft", "trained": True,
           "trajectories": [traj(0, None, toks, 0), traj(1, 0, [" other", "<answer>", "5", "</answer>"], b)]}
    f = tmp_path / "step_1.jsonl"
    f.write_text(json.dumps({"summary": tree_summary(rec), **rec}) + "\n")
    site = tmp_path / "site"
    export_site(Catalog([str(f)]), site)
    open_page(browser, (site / "index.html").as_uri() + "#/tree?run=0&step=1&tree=0", "tree")
    fork = browser.find_element(By.CSS_SELECTOR, 'circle.fork[data-traj="1"]')
    assert fork.get_attribute("data-after-result") == "0" and fork.get_attribute("data-pos") == str(b)
    browser.find_element(By.CSS_SELECTOR, 'circle.leaf[data-traj="0"]').click()
    box = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.CSS_SELECTOR, '#path[data-traj="0"]'))
    [block] = box.find_elements(By.CSS_SELECTOR, ".resultblock")
    assert block.text.startswith("echo + python result 1") and "olleh" in block.text
    [call] = box.find_elements(By.CSS_SELECTOR, ".call")
    assert call.text == "".join(head[3:])  # both calls, from the first opening tag
    assert len(box.find_elements(By.CSS_SELECTOR, ".tok")) == n - len(result)
    assert "P(branch) = 0.6 → branched" in box.find_element(By.CSS_SELECTOR, ".decisionline").text
    shots(browser, "json_calls")


def test_run_page_lists_the_collapse_warnings(browser, tmp_path):
    """training/health.py's warn/<name> flags: listed by step above the curves, and the health panel drawn."""
    run = tmp_path / "collapsed"
    run.mkdir()
    rows = [{"step": 1, "reward_mean": 0.7, "accuracy": 0.7, "constant_groups": 0.25, "calls_frac/2": 1.0},
            {"step": 2, "reward_mean": 0.0, "accuracy": 0.0, "constant_groups": 1.0, "calls_frac/1": 1.0,
             "warn/accuracy_collapse": 1.0, "warn/no_signal": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with view_server(run) as url:
        open_page(browser, url + "#/run", "run")
        box = browser.find_element(By.CSS_SELECTOR, ".collapse-warnings")
        assert "step 2: accuracy_collapse, no_signal" in box.text and "step 1" not in box.text
        panel = browser.find_element(
            By.CSS_SELECTOR, '.panel[data-panel="groups with one reward; share of trajectories by tool calls"]')
        drawn = {p.get_attribute("data-series") for p in panel.find_elements(By.CSS_SELECTOR, "path.series")}
        assert drawn == {"constant_groups", "calls_frac/1", "calls_frac/2"}
