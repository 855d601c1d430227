"""Shared pieces of the benchmarks: data location, splits, text normalisation, BM25 search."""

from __future__ import annotations

import logging
import os
import random
import re
import string
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
logger = logging.getLogger(__name__)

#: Seeds of the fixed splits. A split only depends on (benchmark, seed, sizes).
DEFAULT_SEED = 0


def data_dir() -> Path:
    """Where the offline benchmark data lives.

    ``$AGENTGRAD_DATA_DIR`` when set, else ``<repo_root>/../shared/data`` (the
    layout of the work tree and of CI, where ``shared/`` sits beside the clone).
    """
    env = os.environ.get("AGENTGRAD_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return (REPO_ROOT.parent / "shared" / "data").resolve()


def cache_dir() -> Path:
    """Where downloaded corpora are cached (``$AGENTGRAD_CACHE_DIR`` or ``~/.cache/agentgrad``)."""
    env = os.environ.get("AGENTGRAD_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agentgrad"


def data_file(*parts: str) -> Path:
    path = data_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"benchmark data file not found: {path}. Set AGENTGRAD_DATA_DIR to the folder that "
            "holds hotpotqa/, hover/, ifbench/, ifeval/ (default: <repo_root>/../shared/data)."
        )
    return path


def nltk_data_dir() -> Path:
    return data_dir() / "nltk_data"


def point_nltk_at_shared_data() -> Path:
    """Make NLTK look in the shared ``nltk_data`` first (never downloads anything)."""
    path = nltk_data_dir()
    current = os.environ.get("NLTK_DATA", "")
    if str(path) not in current.split(os.pathsep):
        os.environ["NLTK_DATA"] = os.pathsep.join(p for p in (str(path), current) if p)
    try:
        import nltk

        if str(path) not in nltk.data.path:
            nltk.data.path.insert(0, str(path))
    except ImportError:  # pragma: no cover - nltk is a bench dependency
        pass
    return path


def split_examples(items: Sequence, sizes: Sequence[int], seed: int) -> list[list]:
    """Shuffle ``items`` with ``random.Random(seed)`` and cut consecutive, disjoint slices.

    Raises when the data cannot hold the requested sizes (no silent shrinking).
    """
    need = sum(sizes)
    if need > len(items):
        raise ValueError(f"split sizes {list(sizes)} need {need} examples, only {len(items)} available")
    order = list(items)
    random.Random(seed).shuffle(order)
    out, start = [], 0
    for size in sizes:
        out.append(order[start : start + size])
        start += size
    return out


#: Caps of the GEPA paper's code on train / val / test after its 20/40/40 cut.
ARTIFACT_CAPS = (150, 300, 300)


def artifact_splits(items: Sequence, caps: Sequence[int] = ARTIFACT_CAPS) -> list[list]:
    """The GEPA paper code's split of one pool: test = the first 40%, val = the next 40%, train = the last
    20%, each cut down to its cap by ``random.Random(1).sample`` (a fresh generator per split)."""
    n = len(items)
    test, val, train = items[: int(0.4 * n)], items[int(0.4 * n) : int(0.8 * n)], items[int(0.8 * n) :]
    return [trim_like_artifact(part, cap) for part, cap in zip((train, val, test), caps)]


def trim_like_artifact(items: Sequence, cap: int) -> list:
    """``items`` when it holds no more than ``cap``, else ``random.Random(1).sample(items, cap)``."""
    items = list(items)
    return items if cap >= len(items) else random.Random(1).sample(items, cap)


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA answer normalisation: lowercase, drop punctuation, articles, extra spaces."""
    text = unicodedata.normalize("NFD", str(text or ""))
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def normalize_title(title: str) -> str:
    """Title comparison key: NFD unicode, lowercase, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFD", str(title or "")).lower().split())


def doc_title(doc: str) -> str:
    """Title of a ``"title | text"`` passage."""
    return doc.split(" | ", 1)[0].strip()


#: The stemmer of the GEPA paper's retrieval (PyStemmer's English Snowball stemmer, through bm25s).
DEFAULT_STEMMER = "english"


def load_stemmer(language: str | None):
    """PyStemmer's stemmer for ``language`` (None: no stemming). Without PyStemmer (``pip install
    PyStemmer``, part of the ``[bench]`` extra) the search runs unstemmed and logs a warning."""
    if not language:
        return None
    try:
        import Stemmer
    except ImportError:
        logger.warning("PyStemmer is not installed: BM25 runs without a stemmer (pip install PyStemmer)")
        return None
    return Stemmer.Stemmer(language)


class BM25Search:
    """BM25 over ``"title | text"`` passages (bm25s, k1 = 0.9, b = 0.4, English stopwords and, as in the
    GEPA paper's code, the English stemmer when PyStemmer is installed; ``stemmer=None`` turns it off).

    ``search(query, k)`` returns the k best passages, best first. ``stemmer_name`` says which stemmer
    really ran. Thread-safe.
    """

    def __init__(
        self,
        corpus: Sequence[str],
        k1: float = 0.9,
        b: float = 0.4,
        index_dir: Path | None = None,
        stemmer: str | None = DEFAULT_STEMMER,
    ):
        """Index ``corpus``; with ``index_dir``, load the index saved there (or build and save it)."""
        import bm25s

        if not corpus:
            raise ValueError("BM25Search needs a non-empty corpus")
        self.corpus = list(corpus)
        self._bm25s = bm25s
        self._stemmer = load_stemmer(stemmer)
        self.stemmer_name = stemmer if self._stemmer is not None else None
        self._lock = threading.Lock()
        marker = None if index_dir is None else Path(index_dir) / "agentgrad_corpus_size.txt"
        signature = f"{len(self.corpus)} stemmer={self.stemmer_name}"
        if marker is not None and marker.exists() and marker.read_text().strip() == signature:
            self.retriever = bm25s.BM25.load(str(index_dir))
            return
        tokens = bm25s.tokenize(self.corpus, stopwords="en", stemmer=self._stemmer, show_progress=False)
        self.retriever = bm25s.BM25(k1=k1, b=b)
        self.retriever.index(tokens, show_progress=False)
        if marker is not None:
            Path(index_dir).mkdir(parents=True, exist_ok=True)
            self.retriever.save(str(index_dir))
            marker.write_text(signature)

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, query: str, k: int) -> list[str]:
        k = max(1, min(int(k), len(self.corpus)))
        query = str(query or "").strip() or "?"
        with self._lock:
            tokens = self._bm25s.tokenize([query], stopwords="en", stemmer=self._stemmer, show_progress=False)
            if not tokens.ids or not tokens.ids[0]:
                return self.corpus[:k]
            docs, _scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [self.corpus[int(i)] for i in docs[0]]

    __call__ = search


def _shared_deepcopy(self, memo):
    """Retrievers are read-only and large: copies of a program share them."""
    return self


BM25Search.__deepcopy__ = _shared_deepcopy


class DataUnavailable(RuntimeError):
    """Data a benchmark needs cannot be had: it must be downloaded and there is no network (or no cache)."""


class MissingExtra(RuntimeError):
    """An optional package a benchmark or optimizer needs is not installed (the message names the extra)."""


class CorpusUnavailable(DataUnavailable):
    """The retrieval corpus a benchmark needs cannot be had (offline and not cached)."""


def download_file(url: str, target: Path, *, what: str, timeout: float = 30.0) -> Path:
    """``target``, downloading ``url`` there first unless it is cached; a clear :class:`DataUnavailable`
    (never a traceback) when the download fails, e.g. with no network."""
    import urllib.request

    target = Path(target)
    if target.exists():
        return target
    if os.environ.get("AGENTGRAD_OFFLINE"):
        raise DataUnavailable(f"{what} is not cached at {target} and AGENTGRAD_OFFLINE is set")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(partial, "wb") as out:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
    except Exception as exc:  # no network, DNS failure, HTTP error, timeout
        partial.unlink(missing_ok=True)
        raise DataUnavailable(
            f"could not download {what} from {url} ({type(exc).__name__}: {exc}). Without network, run with "
            f"--source offline, or put the file at {target} by hand."
        ) from exc
    partial.rename(target)
    return target


# The Wikipedia 2017 abstracts (the corpus of HotpotQA's fullwiki setting), as DSPy's retrieval
# tutorials and the GEPA paper's HotpotQA/HoVer programs use it: one JSON object per line,
# {"title": ..., "text": [sentences]}.
WIKI_ABSTRACTS_URL = "https://huggingface.co/dspy/cache/resolve/main/wiki.abstracts.2017.tar.gz"
WIKI_ABSTRACTS_FILE = "wiki.abstracts.2017.jsonl"

_WIKI_LOCK = threading.Lock()
_WIKI_SEARCH: BM25Search | None = None


def wiki_abstracts_path(download: bool = True, timeout: float = 30.0) -> Path:
    """Path of the cached abstracts file; downloads and unpacks it on first use when ``download``."""
    import tarfile
    import urllib.request

    folder = cache_dir() / "wiki_abstracts_2017"
    target = folder / WIKI_ABSTRACTS_FILE
    if target.exists():
        return target
    if not download or os.environ.get("AGENTGRAD_OFFLINE"):
        raise CorpusUnavailable(
            f"Wikipedia 2017 abstracts not cached at {target} "
            f"({'AGENTGRAD_OFFLINE is set' if download else 'download disabled'})"
        )
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "wiki.abstracts.2017.tar.gz"
    try:
        if not archive.exists():
            partial = archive.with_suffix(".part")
            with urllib.request.urlopen(WIKI_ABSTRACTS_URL, timeout=timeout) as resp, open(partial, "wb") as out:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
            partial.rename(archive)
        with tarfile.open(archive) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(".jsonl"))
            member.name = WIKI_ABSTRACTS_FILE
            tar.extract(member, folder)
    except Exception as exc:  # offline, blocked, truncated archive
        raise CorpusUnavailable(
            f"could not download the Wikipedia 2017 abstracts corpus ({WIKI_ABSTRACTS_URL}): {exc}. "
            f"Download and unpack it to {target} (or set AGENTGRAD_CACHE_DIR) to run this benchmark."
        ) from exc
    return target


def load_wiki_abstracts(path: Path, limit: int | None = None) -> list[str]:
    """Passages ``"title | abstract"`` from the abstracts JSONL."""
    import json

    corpus = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            text = row["text"]
            corpus.append(f"{row['title']} | {' '.join(text) if isinstance(text, list) else text}")
            if limit and len(corpus) >= limit:
                break
    return corpus


def wiki_abstracts_search(download: bool = True) -> BM25Search:
    """One process-wide BM25 index over the Wikipedia 2017 abstracts (built once, saved beside the
    cached corpus, loaded from there afterwards)."""
    global _WIKI_SEARCH
    with _WIKI_LOCK:
        if _WIKI_SEARCH is None:
            path = wiki_abstracts_path(download=download)
            _WIKI_SEARCH = BM25Search(load_wiki_abstracts(path), index_dir=path.parent / "bm25_index")
        return _WIKI_SEARCH
