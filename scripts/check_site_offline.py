"""Fails if the built documentation site would fetch anything from the internet when read.

    python scripts/check_site_offline.py SITE_DIR     # after mkdocs build --site-dir SITE_DIR

The site is read where the internet may not be reachable (a cluster's login node, a laptop on a
plane), so every script, style sheet, font and image must come from the site itself. Checked:

- every page: what the browser loads with it (``<script src>``, ``<link href>`` of a style
  sheet, icon, font or preload, ``src``/``srcset``/``poster``/``data`` of images, media and
  frames, SVG ``<image>``/``<use>``), ``url()`` and ``@import`` in ``<style>`` and ``style=``,
  and any URL in an inline ``<script>``: none may be ``http(s)://`` or ``//host``;
- every style sheet: no ``url()`` or ``@import`` of another host;
- every script: the theme fetches from a few hosts when a condition holds (mermaid.js from a
  CDN when a page with a diagram has no ``mermaid`` of its own, a repository's stars from
  GitHub's API when the header shows the repository). Each such URL must be in ``FALLBACKS``
  with the check that keeps it off, and that check must hold on every page; a URL of such a
  host that the table does not know (a new theme release) fails until someone finds out when
  it is fetched.

Exit status 0 when nothing would be fetched, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path

# Attributes whose URL the browser fetches as the page loads, by tag (links are rel-checked).
FETCHED = {
    "script": ("src",),
    "img": ("src", "srcset"),
    "source": ("src", "srcset"),
    "video": ("src", "poster"),
    "audio": ("src",),
    "track": ("src",),
    "iframe": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "input": ("src",),
    "image": ("href", "xlink:href"),
    "use": ("href", "xlink:href"),
}
# <link rel=...> that only name another document; every other rel fetches or connects.
LINK_NAMES_ONLY = frozenset({"canonical", "prev", "next", "alternate", "author", "license", "help"})
EXTERNAL = re.compile(r"^\s*(?:https?:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"""url\(\s*(['"]?)([^'")]*)\1\s*\)|@import\s+(['"])([^'"]*)\3""")
ANY_URL = re.compile(r"https?://[^\s\"'`<>)]+")
# Hosts that serve code, styles, fonts or data to pages; a script naming one may fetch from it.
FETCH_HOSTS = re.compile(
    r"https?://(?:[\w-]+\.)*(?:unpkg\.com|jsdelivr\.net|cdnjs\.cloudflare\.com|esm\.sh|"
    r"skypack\.dev|googleapis\.com|gstatic\.com|api\.github\.com|googletagmanager\.com|"
    r"google-analytics\.com)[^\s\"'`<>)]*",
    re.IGNORECASE,
)
# What the theme's scripts fetch when a condition holds, and what keeps it off.
FALLBACKS = {
    "https://unpkg.com/mermaid@": "only for a page with a diagram and no mermaid of its own: "
    "each such page loads the site's copy (checked on every page)",
    "https://api.github.com/": "only when the header shows the repository (repo_url): no "
    "page does (checked on every page)",
    "https://unpkg.com/resize-observer-polyfill": "only by a browser without ResizeObserver: "
    "every current one has it",
}
# XML namespaces are names, never fetched.
NAMESPACE = re.compile(r"^https?://www\.w3\.org/", re.IGNORECASE)
MERMAID_SCRIPT = "mermaid.min.js"


class _Page(HTMLParser):
    """What one page loads: fetched URLs, inline scripts and styles, diagrams, scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.fetched: list[str] = []
        self.scripts: list[str] = []
        self.inline: list[str] = []
        self.styles: list[str] = []
        self.diagrams = 0
        self.repository = False
        self._text: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for name in FETCHED.get(tag, ()):
            if name in values:
                self.fetched.extend(_srcset(values[name]) if name == "srcset" else [values[name]])
        if tag == "link" and "href" in values:
            rels = set(values.get("rel", "").lower().split())
            if not rels or rels - LINK_NAMES_ONLY:
                self.fetched.append(values["href"])
        if "style" in values:
            self.styles.append(values["style"])
        if tag == "script":
            if "src" in values:
                self.scripts.append(values["src"])
            else:
                self._text = self.inline
        elif tag == "style":
            self._text = self.styles
        if tag == "pre" and "mermaid" in values.get("class", "").split():
            self.diagrams += 1
        if values.get("data-md-component") == "source":
            self.repository = True
        if self._text is not None:
            self._text.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text[-1] += data


def _srcset(value: str) -> list[str]:
    return [part.split()[0] for part in value.split(",") if part.strip()]


def _css_urls(text: str) -> Iterable[str]:
    for match in CSS_URL.finditer(text):
        yield match.group(2) if match.group(4) is None else match.group(4)


def _in_site(site: Path, page: Path, path: str) -> bool:
    """Whether ``path``, as ``page`` names it, is a file of the site."""
    return ((site / path.lstrip("/")) if path.startswith("/") else page.parent / path).is_file()


def _page_problems(site: Path, page: Path, parsed: _Page) -> list[str]:
    problems = [f"loads {url}" for url in parsed.fetched if EXTERNAL.match(url)]
    for style in parsed.styles:
        problems += [f"style loads {url}" for url in _css_urls(style) if EXTERNAL.match(url)]
    for script in parsed.inline:
        urls = [url for url in ANY_URL.findall(script) if not NAMESPACE.match(url)]
        problems += [f"inline script names {url}" for url in urls]
    if parsed.diagrams:
        paths = [src.split("?")[0] for src in parsed.scripts if not EXTERNAL.match(src)]
        own = [p for p in paths if p.endswith(MERMAID_SCRIPT) and _in_site(site, page, p)]
        if not own:
            problems.append(
                f"{parsed.diagrams} Mermaid diagram(s) and no {MERMAID_SCRIPT} of the site's "
                "own: the theme would fetch mermaid.js from a CDN (docs/overrides/main.html "
                "loads docs/vendor/mermaid/ on pages with a diagram)"
            )
    if parsed.repository:
        problems.append(
            "the header shows the repository (repo_url): the theme fetches its stars and "
            "forks from the host's API as the page is read"
        )
    return problems


def _script_problems(text: str) -> list[str]:
    problems = []
    for url in sorted(set(FETCH_HOSTS.findall(text))):
        if not any(url.startswith(known) for known in FALLBACKS):
            problems.append(
                f"names {url}: find out when the theme fetches it, keep that off, and add it "
                "to FALLBACKS in scripts/check_site_offline.py with the check that holds"
            )
    return problems


def check_site(site: Path) -> list[str]:
    """One line per thing that a reader's browser would fetch from another host."""
    problems: list[str] = []
    for path in sorted(site.rglob("*")):
        if not path.is_file():
            continue
        where = path.relative_to(site)
        if path.suffix == ".html":
            parsed = _Page()
            parsed.feed(path.read_text(encoding="utf-8", errors="replace"))
            parsed.close()
            found = _page_problems(site, path, parsed)
        elif path.suffix == ".css":
            text = path.read_text(encoding="utf-8", errors="replace")
            found = [f"loads {url}" for url in _css_urls(text) if EXTERNAL.match(url)]
        elif path.suffix in (".js", ".mjs"):
            found = _script_problems(path.read_text(encoding="utf-8", errors="replace"))
        else:
            continue
        problems += [f"{where}: {problem}" for problem in found]
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: check_site_offline.py SITE_DIR (a site built by mkdocs)", file=sys.stderr)
        return 2
    site = Path(argv[0])
    if not (site / "index.html").is_file():
        print(f"{site}: no index.html: not a built site", file=sys.stderr)
        return 2
    problems = check_site(site)
    for problem in problems:
        print(problem)
    if problems:
        print(f"the site would fetch from the internet: {len(problems)} problem(s)")
        return 1
    print(f"{site}: nothing fetched from another host")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
