"""The benchmarks' English corpus, from two Debian packages (docs/benchmarks.md "Corpus"):

  dict-gcide     the GNU Collaborative International Dictionary of English (Webster's 1913 and
                 additions): 36 MB of English definitions, usage and quotations, GPL
  dict-wn        WordNet 3.0's glosses and example sentences: 31 MB, WordNet licence (free)
  dict-foldoc    the Free On-line Dictionary of Computing: 5.6 MB, GPL
  linux-doc-6.1  the Linux kernel's Documentation in reStructuredText: 28 MB of technical
                 English prose, GPL

Together about 100 MB of English text, over 20 M tokens at a 32 k vocabulary. `write_text` turns them into
a folder of UTF-8 text files, one document per paragraph, that `trainshard data pack` takes;
`packed` packs it once and keeps the dataset for the next run.

  python3 tests/bench/bench_corpus.py --out DIR [--vocab 32000]   # prints the dataset's figures
"""

import argparse
import gzip
import json
import os
import re
import subprocess
import sys

BUILD_DIR = os.environ.get(
    "TS_BUILD_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"))
CLI = os.path.join(BUILD_DIR, "sidecar", "cli", "trainshard")

GCIDE = "/usr/share/dictd/gcide.dict.dz"
WORDNET = "/usr/share/dictd/wn.dict.dz"
FOLDOC = "/usr/share/dictd/foldoc.dict.dz"
LINUX_DOC = "/usr/share/doc/linux-doc-6.1/Documentation"
PACKAGES = ("dict-gcide", "dict-wn", "dict-foldoc", "linux-doc-6.1")

# A line that only names an entry's source ("[1913 Webster]", "[PJC]"): not prose.
SOURCE_TAG = re.compile(r"^\s*\[[^\]]{1,40}\]\s*$")


def ensure_packages():
    if all(os.path.exists(p) for p in (GCIDE, WORDNET, FOLDOC, LINUX_DOC)):
        return
    if os.geteuid() != 0:
        raise SystemExit(f"the benchmark corpus needs {' and '.join(PACKAGES)}: "
                         f"apt-get install {' '.join(PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def emit_entries(name, entries, parts, emit):
    """Entries as paragraphs (one document each), in `parts` files."""
    per = (len(entries) + parts - 1) // parts
    for i in range(parts):
        emit(f"{name}-{i:02d}.txt", "\n\n".join(entries[i * per:(i + 1) * per]) + "\n")


def write_text(out_dir):
    """Writes the corpus as text files under out_dir (made); returns (files, bytes)."""
    ensure_packages()
    os.makedirs(out_dir)
    files = total = 0

    def emit(name, text):
        nonlocal files, total
        data = text.encode("utf-8")
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        files += 1
        total += len(data)

    # GCIDE: the dictionary's entries (paragraphs), source tags dropped, in 40 files.
    with gzip.open(GCIDE, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if not SOURCE_TAG.match(ln)]
    # The first paragraphs are the dictd database's own header.
    entries = "\n".join(lines).split("\n\n")
    entries = [e.strip("\n") for e in entries if e.strip() and "00-database" not in e]
    emit_entries("gcide", entries, 40, emit)

    # WordNet and FOLDOC: an entry starts with its headword at the start of a line.
    for name, path, parts in (("wordnet", WORDNET, 30), ("foldoc", FOLDOC, 6)):
        with gzip.open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        entries, current = [], []
        for line in text.splitlines():
            if line and not line[0].isspace() and current:
                entries.append("\n".join(current).strip("\n"))
                current = []
            if line.strip() and not SOURCE_TAG.match(line):
                current.append(line)
        if current:
            entries.append("\n".join(current))
        entries = [e for e in entries if e.strip() and "00-database" not in e]
        emit_entries(name, entries, parts, emit)

    # The kernel's documentation: every reStructuredText and text source, as it is.
    for root, _, names in sorted(os.walk(LINUX_DOC)):
        for name in sorted(names):
            if not (name.endswith(".rst.gz") or name.endswith(".txt.gz")):
                continue
            path = os.path.join(root, name)
            with gzip.open(path, "rb") as f:
                doc = f.read().decode("utf-8", errors="replace").replace("\0", "")
            if not doc.strip():
                continue
            rel = os.path.relpath(path, LINUX_DOC)[:-3].replace("/", "__")
            emit(f"linux-doc__{rel}", doc if doc.endswith("\n") else doc + "\n")
    return files, total


def packed(work_dir, vocab=32000, shard_tokens=1 << 20, eval_every=50):
    """The packed dataset under work_dir (made and packed on the first call), as `data show`
    prints it."""
    dataset = os.path.join(work_dir, f"dataset-v{vocab}")
    if not os.path.isdir(dataset):
        text = os.path.join(work_dir, "text")
        if not os.path.isdir(text):
            write_text(text)
        r = subprocess.run([CLI, "--json", "data", "pack", "--input", text, "--vocab", str(vocab),
                            "--shard-tokens", str(shard_tokens), "--eval-every",
                            str(eval_every), "--out", dataset],
                           capture_output=True, text=True, timeout=7200)
        if r.returncode != 0:
            raise RuntimeError(f"data pack: {r.stderr[-2000:]}")
    r = subprocess.run([CLI, "--json", "data", "show", "--dir", dataset], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"data show: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="work folder (kept between runs)")
    p.add_argument("--vocab", type=int, default=32000)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(json.dumps(packed(args.out, args.vocab)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
