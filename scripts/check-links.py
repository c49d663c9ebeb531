#!/usr/bin/env python3
"""Check the relative links of the repository's own Markdown files.

Every `[text](path)`, `[text](path#anchor)`, `[text](#anchor)`, image and reference
definition (`[name]: path`) outside fenced code blocks and inline code is checked: the target
must exist (relative to the file that links), and an anchor into a Markdown file must be one
that a heading of that file produces under GitHub's rule (lowercase; punctuation other than
`-` and `_` removed; each space a `-`; `-1`, `-2`, ... for repeated headings) or that an HTML
`id=` / `name=` attribute gives. Links to http(s), mailto and other schemes are skipped; a link
to a file that is not Markdown, or to a directory, is checked for existence only.

Skipped trees: target/, third_party/, .git/ and any fuzz/corpus.

Usage: scripts/check-links.py [ROOT]   (ROOT defaults to the repository, this script's parent)
Exit 0 with `links: N checked, all resolve`; exit 1 listing `file:line: link: reason`.
"""

import os
import re
import sys
import unicodedata
from urllib.parse import unquote

SKIP_DIRS = {"target", "third_party", ".git"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ID = re.compile(r"""<[A-Za-z][^>]*?\s(?:id|name)\s*=\s*["']([^"']+)["']""")
# [text](target) and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REF_DEF = re.compile(r"^ {0,3}\[(?!\^)[^\]]+\]:\s*(<[^>\n]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def skipped(rel_dir):
    parts = rel_dir.split(os.sep)
    if any(p in SKIP_DIRS for p in parts):
        return True
    return any(parts[i] == "fuzz" and parts[i + 1] == "corpus" for i in range(len(parts) - 1))


def markdown_files(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        keep = []
        for d in sorted(dirnames):
            sub = os.path.join(rel, d) if rel else d
            if not skipped(sub):
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            if name.lower().endswith((".md", ".markdown")):
                found.append(os.path.join(dirpath, name))
    return sorted(found)


def strip_inline_code(line):
    """Blank out inline code spans (any run of backticks closed by the same run)."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        if line[i] == "`":
            j = i
            while j < n and line[j] == "`":
                j += 1
            run = line[i:j]
            close = line.find(run, j)
            # A closing run must be exactly as long (not part of a longer run).
            while close != -1 and (
                (close + len(run) < n and line[close + len(run)] == "`")
                or (close > 0 and line[close - 1] == "`")
            ):
                close = line.find(run, close + 1)
            if close == -1:
                out.append(run)
                i = j
                continue
            span = line[i:close + len(run)]
            out.append("".join("\n" if c == "\n" else " " for c in span))
            i = close + len(run)
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def prose_lines(text):
    """Yield (line number, line) outside fenced code blocks and HTML comments."""
    fence = None
    in_comment = False
    for number, line in enumerate(text.split("\n"), 1):
        if fence is not None:
            m = FENCE.match(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not m.group(2).strip():
                fence = None
            continue
        if in_comment:
            end = line.find("-->")
            if end == -1:
                continue
            line = " " * (end + 3) + line[end + 3:]
            in_comment = False
        m = FENCE.match(line)
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = m.group(1)
            continue
        # HTML comments within the line, and one left open.
        while True:
            start = line.find("<!--")
            if start == -1:
                break
            end = line.find("-->", start + 4)
            if end == -1:
                line = line[:start]
                in_comment = True
                break
            line = line[:start] + " " * (end + 3 - start) + line[end + 3:]
        yield number, line


def heading_text(raw):
    """The text GitHub renders for a heading's Markdown."""
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", raw)  # images: their alt text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", text)  # reference links
    out = []
    # Code spans keep their text as it is; markup is taken out of the rest.
    for i, part in enumerate(re.split(r"(`+)(.+?)\1", text)):
        if i % 3 == 1:
            continue  # the backtick run of a code span
        if i % 3 == 2:
            out.append(part.strip() if part.strip() else part)
            continue
        part = re.sub(r"<[^>]+>", "", part)  # inline HTML tags
        part = re.sub(r"(\*+)(\S(?:.*?\S)?)\1", r"\2", part)  # *emphasis*, **strong**
        part = re.sub(r"(?<!\w)(_+)(\S(?:.*?\S)?)\1(?!\w)", r"\2", part)  # _emphasis_
        part = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", part)  # backslash escapes
        out.append(part)
    return "".join(out).strip()


def slugify(text):
    """GitHub's anchor for a heading's text (github-slugger)."""
    out = []
    for ch in text.lower():
        if ch in "-_ ":
            out.append(ch)
            continue
        cat = unicodedata.category(ch)
        if cat[0] in ("L", "N", "M") or cat == "Pc":
            out.append(ch)
    return "".join(out).replace(" ", "-")


_anchor_cache = {}


def anchors_of(path):
    if path in _anchor_cache:
        return _anchor_cache[path]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        _anchor_cache[path] = set()
        return _anchor_cache[path]
    anchors = set()
    occurrences = {}

    def add(heading):
        slug = slugify(heading_text(heading))
        original = slug
        while slug in occurrences:
            occurrences[original] += 1
            slug = "%s-%d" % (original, occurrences[original])
        occurrences[slug] = 0
        anchors.add(slug)

    previous = None  # the previous prose line, for setext headings
    for _, line in prose_lines(text):
        for m in HTML_ID.finditer(line):
            anchors.add(m.group(1))
        m = ATX.match(line)
        if m:
            add(m.group(2) or "")
            previous = None
            continue
        s = SETEXT.match(line)
        if (s and previous is not None and previous.strip()
                and not re.match(r"^ {0,3}([-*+]|\d+[.)])(\s|$)", previous)
                and not previous.lstrip().startswith(("|", ">"))
                and not FENCE.match(previous)):
            add(previous.strip())
            previous = None
            continue
        previous = line
    _anchor_cache[path] = anchors
    return anchors


def links_of(text):
    """Yield (line number, target) for every link outside code.

    A paragraph is searched whole, so that a link whose text runs over a line break is found
    and an inline code span over a line break is skipped."""
    block = []  # (number, line) of the current paragraph

    def search(block):
        numbers = [n for n, _ in block]
        joined = strip_inline_code("\n".join(line for _, line in block))
        for i, line in enumerate(joined.split("\n")):
            m = REF_DEF.match(line)
            if m:
                yield numbers[i], m.group(1)
        for m in INLINE_LINK.finditer(joined):
            yield numbers[joined.count("\n", 0, m.start())], m.group(1)

    last = None
    for number, line in prose_lines(text):
        if not line.strip() or (last is not None and number != last + 1):
            yield from search(block)
            block = []
        if line.strip():
            block.append((number, line))
        last = number
    yield from search(block)


def check(root):
    files = markdown_files(root)
    checked = 0
    broken = []
    for path in files:
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for number, target in links_of(text):
            link = target
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            checked += 1
            file_part, _, anchor = target.partition("#")
            file_part = unquote(file_part.split("?", 1)[0])
            anchor = unquote(anchor)
            if file_part:
                if file_part.startswith("/"):
                    dest = os.path.join(root, file_part.lstrip("/"))
                else:
                    dest = os.path.join(os.path.dirname(path), file_part)
                dest = os.path.normpath(dest)
                if not os.path.exists(dest):
                    broken.append("%s:%d: %s: no such file or directory (%s)"
                                  % (rel, number, link, os.path.relpath(dest, root)))
                    continue
            else:
                dest = path
            if not anchor:
                continue
            if os.path.isdir(dest) or not dest.lower().endswith((".md", ".markdown")):
                continue  # line anchors into source files and the like: existence only
            if anchor not in anchors_of(dest):
                broken.append("%s:%d: %s: no heading gives #%s in %s"
                              % (rel, number, link, anchor, os.path.relpath(dest, root)))
    return checked, broken


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(
        os.path.abspath(__file__)), os.pardir)
    root = os.path.normpath(os.path.abspath(root))
    checked, broken = check(root)
    if broken:
        for b in broken:
            print(b)
        print("links: %d checked, %d broken" % (checked, len(broken)), file=sys.stderr)
        return 1
    print("links: %d checked, all resolve" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
