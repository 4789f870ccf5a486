"""GPTCache 0.1.44 as a peer, run inside its own venv by bench/semantic_eval.py.

Its own components: SBERT embedding (given the packaged local MiniLM folder: its default ONNX
embedding downloads from a hub and cannot load offline), sqlite + FAISS data manager,
SearchDistanceEvaluation, default similarity_threshold 0.8. max_size is raised above the
default 1,000 (which silently caps the store) so every first text is cached.
Usage: python gptcache_peer.py IN.json OUT.json (IN: {model, entries, queries}).
"""

import json
import sys
import tempfile
import time

from gptcache import Cache, Config
from gptcache.adapter.api import get, put
from gptcache.embedding import SBERT
from gptcache.manager import CacheBase, VectorBase, get_data_manager
from gptcache.processor.pre import get_prompt
from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    work = tempfile.mkdtemp(prefix="gptcache-peer-")
    emb = SBERT(job["model"])
    n = len(job["entries"]) + 10
    dm = get_data_manager(
        CacheBase("sqlite", sql_url=f"sqlite:///{work}/cache.db"),
        VectorBase("faiss", dimension=emb.dimension, index_path=f"{work}/faiss.index", top_k=1),
        max_size=n,
    )
    cache = Cache()
    cache.init(
        pre_embedding_func=get_prompt,
        embedding_func=emb.to_embeddings,
        data_manager=dm,
        similarity_evaluation=SearchDistanceEvaluation(),
        config=Config(similarity_threshold=job.get("threshold", 0.8)),
    )
    t0 = time.perf_counter()
    for i, text in enumerate(job["entries"]):
        put(text, str(i), cache_obj=cache)
    put_s = time.perf_counter() - t0
    answers, lat = [], []
    for q in job["queries"]:
        t = time.perf_counter()
        ans = get(q, cache_obj=cache)
        lat.append(time.perf_counter() - t)
        answers.append(int(ans) if ans is not None else -1)
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump({"answers": answers, "latency_s": lat, "put_s": put_s}, fh)


if __name__ == "__main__":
    main()
