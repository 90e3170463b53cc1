import sys, io, time
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__file__), '..', '..', 'lib', 'marin', 'src'))
from marin.web.debian_docs import find_pages
from warcio.warcwriter import WARCWriter
from warcio.statusandheaders import StatusAndHeaders
pages = find_pages(150)
n = 4
for k in range(n):
    with open(f'/tmp/web-choices/pages-{k}.warc.gz', 'wb') as f:
        w = WARCWriter(f, gzip=True)
        for p in pages[k::n]:
            body = p.read()
            http = StatusAndHeaders('200 OK', [('Content-Type', 'text/html; charset=UTF-8'), ('Content-Length', str(len(body)))], protocol='HTTP/1.1')
            rec = w.create_warc_record(p.url, 'response', payload=io.BytesIO(body), http_headers=http, warc_headers_dict={'WARC-Date': '2026-01-01T00:00:00Z'})
            w.write_record(rec)
