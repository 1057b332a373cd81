"""`arpo eval --out` that cannot be written at the end (a full disk, a folder removed meanwhile) keeps
the evaluation in a temporary file, says where, and exits 1 — it exited 0 as if --out held it."""

import os
import shutil
import subprocess
import sys


def test_eval_out_not_written_is_not_a_success(tmp_path):
    sub = tmp_path / "sub"
    out = sub / "e.json"
    p = subprocess.Popen([sys.executable, "-m", "arpo", "eval", "--model", "tiny-random", "--data", "svamp:test[0:4]",
                          "--max-response-tokens", "48", "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    err = []
    for line in p.stderr:  # the folder goes while the questions are answered (as a disk fills meanwhile)
        err.append(line)
        if line.startswith("arpo eval: prompt template"):
            shutil.rmtree(sub)
            break
    _, rest = p.communicate(timeout=300)
    err = "".join(err) + rest
    assert p.returncode == 1, err[-2000:]
    assert f"could not write {out}" in err and "the evaluation is kept in" in err and "Traceback" not in err, err
    spare = err.split("the evaluation is kept in ")[1].split()[0]
    assert os.path.getsize(spare) > 0
    os.unlink(spare)
