"""The pipelines bench_web.py compares, each run in a child process of its own: zephyr's (the
marin.web steps on Ray or a threadpool), datatrove's (WarcReader -> an extractor ->
LanguageFilter -> Gopher repetition, Gopher quality, C4, FineWeb filters -> JsonlWriter) and a
hand-written loop calling the same libraries as zephyr's (fastwarc, resiliparse, fastText
lid.176, marin.web.rules) from a process pool. All keep English pages (language score >= 0.65)
that pass every rule, and write them as JSON Lines; `kept_urls` reads back what each kept.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import resource
import sys
from multiprocessing import get_context

import orjson
import zstandard

MIN_LANGUAGE_SCORE = 0.65  # FineWeb's, datatrove's LanguageFilter default
# datatrove's extractors give up on a page after `timeout` wall seconds (default 1 s; 0.1 s for
# some): on this shared, loaded machine that drops large pages at random, so it is raised
EXTRACT_TIMEOUT = 120.0


def quiet_datatrove() -> None:
    """datatrove logs every file and block at INFO; keep its warnings."""
    from datatrove.utils.logging import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")


def tree_cpu() -> float:
    """CPU seconds of this process, its reaped children and every live descendant (Ray's workers
    and daemons, a pool's workers)."""
    import psutil

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
            cpu += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:  # exited between listing and reading
            continue
    return cpu


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


class PeakSampler:
    """The largest peak RSS (VmHWM) of this process and its descendants, read every `interval`
    seconds from a thread (datatrove's workers exit before the end; `ru_maxrss` will not do: a
    process keeps the peak of the one it was exec'd from)."""

    def __init__(self, interval: float = 0.5):
        import threading

        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def sample(self) -> None:
        import psutil

        for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
            try:
                self.peak = max(self.peak, _peak_rss(proc.pid))
            except (psutil.Error, OSError, StopIteration):
                continue

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def stop(self) -> int:
        self.sample()
        self._stop.set()
        self._thread.join()
        return self.peak


# ---- zephyr -------------------------------------------------------------------------------


def warm_worker(i: int) -> int:
    """What every variant's workers do before the clock starts: import the modules (no model loaded)."""
    import fastwarc.warc  # noqa: F401
    import resiliparse.extract.html2text  # noqa: F401

    import marin.web.extract  # noqa: F401
    import marin.web.langid  # noqa: F401
    import marin.web.quality  # noqa: F401
    import zephyr.io.warc  # noqa: F401

    return i


def run_zephyr(warcs: list[str], out: str, cores: int, backend_name: str) -> None:
    """The marin.web steps as one zephyr pipeline (one shard per file)."""
    from marin.web import HtmlExtractor, LanguageIdentifier, QualityFilter
    from zephyr import Dataset, create_backend

    backend = create_backend(backend_name, max_parallelism=cores, progress=False, memory="1GiB")
    pipeline = (
        Dataset.from_files(warcs).load_warc(on_bad_record="skip")
        .flat_map(HtmlExtractor())
        .flat_map(LanguageIdentifier(("en",), MIN_LANGUAGE_SCORE))
        .flat_map(QualityFilter())
        .write_jsonl(f"{out}/part-{{shard:05d}}.jsonl.zst")
    )
    list(backend.execute(pipeline))


def warm_ray(cores: int) -> None:
    """Start a local Ray with `cores` CPUs and its workers, warmed (`warm_worker`)."""
    from zephyr import Dataset, create_backend
    from zephyr.backends.ray_local import start_local_ray

    start_local_ray(num_cpus=cores, log_to_driver=False)
    list(create_backend("ray", max_parallelism=cores, progress=False).execute(Dataset.from_list(list(range(4 * cores))).map(warm_worker)))


# ---- the hand-written loop ------------------------------------------------------------------


def hand_file(job: tuple[str, str]) -> int:
    """One WARC file through the libraries, no platform: read, decode, extract, identify, rules, write."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from resiliparse.extract.html2text import extract_plain_text

    from marin.web.extract import decode_html
    from marin.web.langid import language_model
    from marin.web.quality import QualityFilter, first_broken_rule

    path, out = job
    rules, model, kept = QualityFilter(), language_model(), 0
    with open(path, "rb") as f, open(out, "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as w:
        for record in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
            html, _ = decode_html(record.reader.read(), record.http_charset)
            text = extract_plain_text(html, main_content=True, alt_texts=False).strip()
            if not text:
                continue
            labels, scores = model.predict(text.replace("\n", " "), k=1)
            language, score = labels[0].removeprefix("__label__"), min(float(scores[0]), 1.0)
            if language != "en" or score < MIN_LANGUAGE_SCORE:
                continue
            rule, text = first_broken_rule(text, rules)
            if rule is None:
                url = record.headers.get("WARC-Target-URI")
                w.write(orjson.dumps({"url": url, "text": text, "language": language, "language_score": round(score, 4)}) + b"\n")
                kept += 1
    return kept


def warm_pool(cores: int):
    """A process pool of `cores` workers, warmed as Ray's are (`warm_worker`)."""
    pool = get_context("forkserver").Pool(cores)
    pool.map(warm_worker, range(4 * cores), chunksize=1)
    return pool


def run_hand(warcs: list[str], out: str, pool) -> None:
    jobs = [(path, f"{out}/part-{i:05d}.jsonl.zst") for i, path in enumerate(warcs)]
    sum(pool.imap_unordered(hand_file, jobs))


# ---- datatrove ------------------------------------------------------------------------------


def trafilatura_extractor():
    from datatrove.pipeline.extractors import Trafilatura

    return Trafilatura(timeout=EXTRACT_TIMEOUT)


def resiliparse_extractor():
    from datatrove.pipeline.extractors.base import BaseExtractor

    class ResiliparseExtractor(BaseExtractor):
        """resiliparse's main-content extraction as a datatrove block (in its sandbox process)."""

        name = "resiliparse"

        def __init__(self, timeout: float = EXTRACT_TIMEOUT):
            super().__init__(timeout)

        def extract(self, text: str) -> str:
            from resiliparse.extract.html2text import extract_plain_text

            return extract_plain_text(text, main_content=True, alt_texts=False)

    return ResiliparseExtractor()


def bundled_language_filter():
    """datatrove's LanguageFilter on the lid.176 model marin.web uses (its own default downloads
    lid.176.bin at run time, which this machine cannot; one model also keeps the comparison to
    the pipelines)."""
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.utils.lid import FT176LID

    from marin.web.langid import model_path

    class BundledLID(FT176LID):
        @property
        def model(self):
            if self._model is None:
                from fasttext.FastText import _FastText

                self._model = _FastText(model_path())
            return self._model

    class BundledLanguageFilter(LanguageFilter):
        def __new__(cls, *args, **kwargs):
            # datatrove wants the `fasttext-numpy2-wheel` distribution; the same `fasttext`
            # module comes here from `fasttext-numpy2` (see benchmarks/README.md section 18)
            return object.__new__(cls)

    step = BundledLanguageFilter(languages="en", language_threshold=MIN_LANGUAGE_SCORE)
    step.model = BundledLID(["en"])
    return step


def datatrove_filters() -> list:
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    return [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()]


def run_datatrove(warc_dir: str, out: str, cores: int, extractor: str, logs: str) -> None:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import JsonlWriter

    quiet_datatrove()
    extract = trafilatura_extractor() if extractor == "trafilatura" else resiliparse_extractor()
    pipeline = [WarcReader(warc_dir, glob_pattern="*.warc.gz"), extract, bundled_language_filter(), *datatrove_filters(),
                JsonlWriter(out)]
    tasks = len(glob.glob(f"{warc_dir}/*.warc.gz"))
    LocalPipelineExecutor(pipeline, tasks=tasks, workers=cores, logging_dir=logs).run()


# ---- what each kept ----------------------------------------------------------------------


def kept_urls(out: str) -> list[str]:
    """The URLs in a pipeline's output files (zephyr's and the loop's .jsonl.zst, datatrove's .jsonl.gz)."""
    urls = []
    for path in sorted(glob.glob(f"{out}/*.jsonl.zst")):
        with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
            urls += [json.loads(line)["url"] for line in r.read().decode().splitlines()]
    for path in sorted(glob.glob(f"{out}/*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            urls += [json.loads(line)["metadata"]["url"] for line in f]
    return sorted(urls)


def run_variant(spec: dict) -> dict:
    """Run one pipeline (timed from its start to its outputs written) and measure it."""
    import time

    variant, out, cores = spec["variant"], spec["out"], spec["cores"]
    os.makedirs(out, exist_ok=True)
    if variant == "zephyr-ray":
        warm_ray(cores)
    elif variant == "zephyr-threadpool":
        warm_worker(0)
    pool = warm_pool(cores) if variant == "hand" else None
    sampler = PeakSampler()
    cpu0 = tree_cpu()
    start = time.perf_counter()
    if variant.startswith("zephyr"):
        run_zephyr(spec["warcs"], out, cores, variant.removeprefix("zephyr-"))
    elif variant == "hand":
        run_hand(spec["warcs"], out, pool)
    else:  # its executor starts its own processes: they start within the clock
        run_datatrove(spec["warc_dir"], out, cores, variant.removeprefix("datatrove-"), spec["logs"])
    seconds = time.perf_counter() - start
    cpu1, peak = tree_cpu(), sampler.stop()
    if pool is not None:
        pool.close()
    return {"variant": variant, "seconds": seconds, "cpu_s": cpu1 - cpu0, "peak_rss_mib": peak / 2**20, "kept": kept_urls(out)}
