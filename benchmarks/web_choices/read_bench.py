import time, resource, sys
def warcio_read(path):
    from warcio.archiveiterator import ArchiveIterator
    n = b = 0
    with open(path, 'rb') as f:
        for r in ArchiveIterator(f):
            if r.rec_type != 'response': continue
            url = r.rec_headers.get_header('WARC-Target-URI'); date = r.rec_headers.get_header('WARC-Date')
            ct = r.http_headers.get_header('Content-Type')
            payload = r.content_stream().read()
            n += 1; b += len(payload)
    return n, b
def fastwarc_read(path):
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    n = b = 0
    with open(path, 'rb') as f:
        for r in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
            url = r.headers.get('WARC-Target-URI'); date = r.headers.get('WARC-Date')
            ct = r.http_content_type; cs = r.http_charset
            payload = r.reader.read()
            n += 1; b += len(payload)
    return n, b
fn = globals()[sys.argv[1]]
t = time.process_time(); w = time.perf_counter()
n, b = fn(sys.argv[2])
print(sys.argv[1], n, 'records', b/1e6, 'MB payload', 'cpu %.2f s' % (time.process_time()-t), 'wall %.2f' % (time.perf_counter()-w), 'MB/s %.0f' % (b/1e6/(time.process_time()-t)), 'rss MiB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024)
