"""Web pages to training text: the steps between a crawl (`zephyr`'s `load_warc()`) and dedup.

One module per job, each step a small frozen callable for `Dataset.flat_map` that counts what
it drops:

- `extract`: main text from HTML (`HtmlExtractor`, resiliparse; trafilatura as an option);
- `langid`: language and score (`LanguageIdentifier`, fastText lid.176 shipped in a package);
- `rules`, `quality`: Gopher, C4 and FineWeb heuristics with one counter per rule (`QualityFilter`);
- `classifier`: a fastText quality classifier, trained from labelled JSONL and scored on the
  workers (`train_quality_classifier`, `QualityClassifier`);
- `debian_docs`, `sample_warc`: real pages to test and measure on (Debian's documentation
  packages, wrapped into WARC files).

The worked pipeline is `experiments/curate_web.py`; docs/web.md describes the whole.
"""

from marin.web.classifier import QualityClassifier, train_quality_classifier
from marin.web.extract import HtmlExtractor, extract_text
from marin.web.langid import LanguageIdentifier, identify_language
from marin.web.quality import QualityFilter

__all__ = [
    "HtmlExtractor", "LanguageIdentifier", "QualityClassifier", "QualityFilter", "extract_text", "identify_language",
    "train_quality_classifier",
]
