"""Compare extractors on the Debian doc pages: CPU per page, heading/paragraph recall, nav leakage."""
import sys, time, re, statistics
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__file__), '..', '..', 'lib', 'marin', 'src'))
from marin.web.debian_docs import find_pages
import lxml.html
SPACE = re.compile(r"\s+")
norm = lambda s: SPACE.sub(" ", s).strip()
MAIN = {"debian-reference": "//div[@class='chapter' or @class='preface' or @class='appendix' or @class='book']",
        "python3.11-doc": "//div[@role='main']", "cppreference-doc-en-html": "//div[@id='mw-content-text']"}
NAV = {"debian-reference": "//div[@class='navheader' or @class='navfooter']",
       "python3.11-doc": "//div[@class='related'] | //div[@class='sphinxsidebar'] | //nav | //div[@class='footer']",
       "cppreference-doc-en-html": "//div[@class='t-navbar'] | //div[@id='catlinks'] | //div[@class='printfooter']"}
def oracle(page, html):
    site = "debian-reference" if page.package.startswith("debian-reference") else page.package
    tree = lxml.html.fromstring(html)
    for anchor in tree.xpath("//a[@class='headerlink']"):  # Sphinx's permalink mark after each heading
        anchor.drop_tree()
    mains = tree.xpath(MAIN[site])
    main_text = norm(" ".join(m.text_content() for m in mains))
    navs = tree.xpath(NAV[site])
    nav_in_main = set()
    for n in navs:
        for m in mains:
            if n in m.iterdescendants(): nav_in_main.add(n)
    heads, paras = [], []
    for m in mains:
        heads += [norm(h.text_content()) for h in m.xpath(".//h1|.//h2|.//h3|.//h4|.//h5|.//h6")]
        paras += [norm(p.text_content()) for p in m.xpath(".//p") if not any(p in n.iterdescendants() for n in navs)]
    heads = [h for h in heads if len(h) >= 3]
    paras = [p for p in paras if len(p) >= 40]
    links = {norm(a.text_content()) for n in navs for a in n.xpath(".//a")}
    links = [l for l in links if len(l) >= 4 and l not in main_text]
    return heads, paras, links

def score(text, heads, paras, links):
    t = norm(text)
    f = lambda xs: (sum(x in t for x in xs), len(xs))
    return f(heads), f(paras), f(links)

def resiliparse_extract(html):
    from resiliparse.extract.html2text import extract_plain_text
    return extract_plain_text(html.decode('utf-8', 'replace'), main_content=True, alt_texts=False)
def resiliparse_all(html):
    from resiliparse.extract.html2text import extract_plain_text
    return extract_plain_text(html.decode('utf-8', 'replace'), main_content=False, alt_texts=False)
def resiliparse_extract_tree(html):
    from resiliparse.parse.html import HTMLTree
    from resiliparse.extract.html2text import extract_plain_text
    return extract_plain_text(HTMLTree.parse_from_bytes(html, 'utf-8'), main_content=True, alt_texts=False)
def trafilatura_extract(html):
    import trafilatura
    return trafilatura.extract(html.decode('utf-8', 'replace'), include_comments=False, include_tables=True, favor_recall=False) or ""
def trafilatura_recall(html):
    import trafilatura
    return trafilatura.extract(html.decode('utf-8', 'replace'), include_comments=False, favor_recall=True) or ""

pages = find_pages(150)
data = [(p, p.read()) for p in pages]
oracles = [oracle(p, h) for p, h in data]
for name in sys.argv[1:]:
    fn = globals()[name]
    fn(data[0][1])
    t0 = time.process_time()
    outs = [fn(h) for _, h in data]
    cpu = time.process_time() - t0
    by = {}
    for (p, h), o, text in zip(data, oracles, outs):
        site = "debian-reference" if p.package.startswith("debian-reference") else p.package.split("-")[0]
        s = score(text, *o)
        agg = by.setdefault(site, [[0,0],[0,0],[0,0]])
        for i in range(3):
            agg[i][0] += s[i][0]; agg[i][1] += s[i][1]
    mb = sum(len(h) for _, h in data) / 1e6
    print(f"{name}: {cpu:.2f} CPU s for {len(data)} pages ({mb:.1f} MB): {cpu/len(data)*1000:.1f} ms/page, {mb/cpu:.1f} MB/s")
    for site, agg in by.items():
        print(f"   {site:18s} headings {agg[0][0]/max(agg[0][1],1):.1%} of {agg[0][1]}  paragraphs {agg[1][0]/max(agg[1][1],1):.1%} of {agg[1][1]}  nav links leaked {agg[2][0]/max(agg[2][1],1):.1%} of {agg[2][1]}")

def misses(name, k=0, pkg="debian-reference-en"):
    fn = globals()[name]
    for (p, h), o in zip(data, oracles):
        if p.package == pkg:
            if k: k -= 1; continue
            t = norm(fn(h))
            print(p.path, [x for x in o[1] if x not in t][:4])
            print([x for x in o[0] if x not in t][:4])
            return t
