#!/usr/bin/env python3
"""Checks every relative link of the built book (mdbook build docs -> docs/book).

Usage: .ci/check-book-links.py [BOOK_DIR]   (default: docs/book)

Every href and src of every HTML page that is not an absolute URL must name a file that
exists: inside the book, or in the repository for links that leave it (the book is
built in place, docs/book sits where docs/src does, so a chapter's `../../gateway.toml`
is the repository's file in the source and in the HTML alike). A link with a #fragment
into a page of the book must name an id of that page. Exits 1 listing every broken link.
Standard library only.
"""

import os
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit


class Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []  # (line, url)
        self.base = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("id",):
            if attrs.get(name):
                self.ids.add(attrs[name])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        if tag == "base" and attrs.get("href") is not None:
            self.base = attrs["href"]
            return
        for name in ("href", "src"):
            value = attrs.get(name)
            if value is not None:
                self.links.append((self.getpos()[0], value))


def main():
    book = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "docs/book")
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isfile(os.path.join(book, "index.html")):
        print(f"check-book-links: no built book at {book}", file=sys.stderr)
        return 1
    pages = {}
    for root, _, files in os.walk(book):
        for f in files:
            if f.endswith(".html"):
                path = os.path.join(root, f)
                page = Page()
                with open(path, encoding="utf-8") as fh:
                    page.feed(fh.read())
                pages[path] = page

    broken = []
    checked = 0
    for path, page in sorted(pages.items()):
        here = os.path.dirname(path)
        if page.base is not None:
            if page.base != "/":
                broken.append(f"{os.path.relpath(path, book)}: unsupported <base href={page.base!r}>")
                continue
            here = book  # mdbook's 404 page: links relative to the site root
        for line, url in page.links:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc:
                continue  # absolute URLs (https:, mailto:, javascript:) are not checked
            checked += 1
            where = f"{os.path.relpath(path, book)}:{line}: {url}"
            if parts.path:
                target = os.path.normpath(os.path.join(here, unquote(parts.path)))
            else:
                target = path
            if os.path.isdir(target):
                target = os.path.join(target, "index.html")
            inside_book = target == book or target.startswith(book + os.sep)
            inside_repo = target.startswith(repo + os.sep)
            if not inside_repo:
                broken.append(f"{where}: leaves the repository")
                continue
            if not os.path.exists(target):
                broken.append(f"{where}: no file {os.path.relpath(target, repo)}")
                continue
            fragment = unquote(parts.fragment)
            if fragment and inside_book and target.endswith(".html"):
                if fragment not in pages[target].ids:
                    broken.append(f"{where}: no id {fragment!r} in {os.path.relpath(target, book)}")

    if broken:
        print(f"check-book-links: {len(broken)} broken link(s):", file=sys.stderr)
        for b in broken:
            print(f"  {b}", file=sys.stderr)
        return 1
    print(f"check-book-links: {checked} relative links in {len(pages)} pages resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
