import sys, collections, time
from marin.web.debian_docs import find_pages
from marin.web.extract import HtmlExtractor
from marin.web.langid import identify_language
from marin.web.sample_warc import page_record, bad_pages
from marin.web import rules as R
from datatrove.data import Document
from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter, FineWebQualityFilter
ex = HtmlExtractor()
texts = [ex(page_record(p))[0]["text"] for p in find_pages(150)]
texts = [t for t in texts if identify_language(t)[0] == "en"]
print(len(texts), "English pages")
pairs = [("gopher_repetition", GopherRepetitionFilter(), R.GopherRepetitionRules()), ("gopher_quality", GopherQualityFilter(), R.GopherQualityRules()),
         ("c4", C4QualityFilter(), R.C4Rules()), ("fineweb", FineWebQualityFilter(), R.FineWebRules())]
for name, theirs, ours in pairs:
    same = 0; both_keep = 0; diffs = collections.Counter(); t_ours = t_theirs = 0
    for t in texts:
        t0 = time.process_time(); d = theirs.filter(Document(text=t, id="x")); t_theirs += time.process_time() - t0
        tk = d is True; tr = None if tk else d[1]
        t0 = time.process_time()
        if name == "c4":
            orule, _, _ = ours(t)
        else:
            orule = ours(t, R.split_words(t))
        t_ours += time.process_time() - t0
        ok = orule is None
        same += ok == tk
        if ok != tk: diffs[(tr, orule)] += 1
    print(f"{name}: agree {same}/{len(texts)} = {same/len(texts):.1%}; cpu ours {t_ours:.2f}s theirs {t_theirs:.2f}s; diffs {diffs.most_common(6)}")
