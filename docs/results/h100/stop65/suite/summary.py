import json, sys, collections
def load(paths):
    rows = collections.defaultdict(dict)
    for p in paths:
        for r in json.load(open(p))['results']:
            if r['status'] == 'ok':
                rows[r['case']][r['impl']] = r['median_ms']
    return rows
def summary(rows, tag):
    ge, paged_ok, paged_n, misses, pmiss = 0, 0, 0, [], []
    for c, m in sorted(rows.items()):
        best = min(m[i] for i in m if i.startswith('torch'))
        ratio = best / m['ours']
        ge += ratio >= 1.0
        if ratio < 1.0: misses.append((c.replace('decode_', ''), round(ratio, 3)))
        for p in ('ours-paged16', 'ours-paged256'):
            if p in m:
                paged_n += 1; q = m[p] / m['ours']; paged_ok += q <= 1.05
                if q > 1.05: pmiss.append((c.replace('decode_', ''), p[-3:].lstrip('d'), round(q, 3)))
    print(f"{tag}: ours >= faster torch {ge}/{len(rows)}; paged within 5 % {paged_ok}/{paged_n}")
    print("   under 1.0x:", misses)
    print("   paged over 5 %:", pmiss)
for tag, paths in [(a.split('=')[0], a.split('=')[1].split(',')) for a in sys.argv[1:]]:
    summary(load(paths), tag)
