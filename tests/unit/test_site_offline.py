"""The documentation site fetches nothing from the internet when read: the check
(``scripts/check_site_offline.py``) on small sites, and on the real site where mkdocs is here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.scripts import load

ROOT = Path(__file__).resolve().parents[2]
check = load("check_site_offline")

CLEAN = """<!doctype html><html><head>
<link rel="stylesheet" href="assets/main.css"><link rel="icon" href="assets/favicon.png">
<link rel="next" href="https://example.com/next/"><script>var a = 1;</script>
</head><body><a href="https://example.com/">a link is not fetched</a>
<svg xmlns="http://www.w3.org/2000/svg"><use href="#icon"/></svg>
<pre><code>endpoint_url = "https://s3.example.com"</code></pre>
<script src="assets/bundle.js"></script></body></html>"""


def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    site = tmp_path / "site"
    files = {
        "index.html": CLEAN,
        "assets/main.css": 'body{background:url("data:image/svg+xml,<svg/>")}',
        "assets/bundle.js": 'load("https://unpkg.com/mermaid@11/dist/mermaid.min.js")',
        **pages,
    }
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return site


def test_a_site_of_its_own_files_passes(tmp_path: Path) -> None:
    assert check.check_site(_site(tmp_path, {})) == []


@pytest.mark.parametrize(
    ("html", "fetched"),
    [
        ('<script src="https://unpkg.com/x.js"></script>', "https://unpkg.com/x.js"),
        ('<link rel="stylesheet" href="//cdn.example/s.css">', "//cdn.example/s.css"),
        ('<link rel="preconnect" href="https://fonts.gstatic.com">', "https://fonts.gstatic.com"),
        ('<img srcset="a.png 1x, https://img.example/b.png 2x">', "https://img.example/b.png"),
        ('<div style="background: url(https://img.example/c.png)"></div>', "img.example/c.png"),
        ("<style>@import 'https://fonts.googleapis.com/css';</style>", "fonts.googleapis.com"),
        ('<script>s.src="https://www.googletagmanager.com/gtag/js"</script>', "googletagmanager"),
    ],
)
def test_a_page_that_loads_from_another_host_fails(tmp_path: Path, html: str, fetched: str) -> None:
    problems = check.check_site(_site(tmp_path, {"p/index.html": html}))
    assert len(problems) == 1 and problems[0].startswith("p/index.html: ")
    assert fetched in problems[0]


def test_a_diagram_needs_the_sites_own_mermaid(tmp_path: Path) -> None:
    diagram = '<pre class="mermaid"><code>flowchart TD</code></pre>'
    own = '<script src="../vendor/mermaid.min.js"></script>'
    site = _site(tmp_path, {"p/index.html": diagram, "vendor/mermaid.min.js": "var mermaid;"})
    (problem,) = check.check_site(site)
    assert "1 Mermaid diagram(s) and no mermaid.min.js" in problem and "CDN" in problem
    (site / "p/index.html").write_text(diagram + own)
    assert check.check_site(site) == []
    (site / "vendor/mermaid.min.js").unlink()  # a script that is not there does not count
    assert len(check.check_site(site)) == 1


def test_styles_and_scripts_of_the_site_are_checked(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        {
            "assets/fonts.css": "@font-face{src:url('https://fonts.gstatic.com/r.woff2')}",
            "assets/new.js": 'fetch("https://cdn.jsdelivr.net/npm/katex/katex.min.css")',
            "p/index.html": '<header><a data-md-component="source" href="https://x"></a></header>',
        },
    )
    problems = check.check_site(site)
    assert [p.split(":")[0] for p in problems] == [
        "assets/fonts.css",
        "assets/new.js",
        "p/index.html",
    ]
    assert "FALLBACKS" in problems[1] and "repo_url" in problems[2]


def test_the_command_says_what_it_found(tmp_path: Path) -> None:
    site = _site(tmp_path, {})
    assert check.main([str(site)]) == 0
    (site / "p.html").write_text('<script src="https://unpkg.com/x.js"></script>')
    assert check.main([str(site)]) == 1
    assert check.main([str(tmp_path / "nowhere")]) == 2


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (the docs extra): .ci/run's docs step builds the site "
    "and runs this check on it",
)
def test_the_documentation_site_fetches_nothing(tmp_path: Path) -> None:
    site = tmp_path / "built"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert check.check_site(site) == []
    # The diagrams are there, drawn by the site's own copy of mermaid.js.
    page = (site / "design/architecture/index.html").read_text()
    assert '<pre class="mermaid">' in page
    assert '<script src="../../vendor/mermaid/mermaid.min.js">' in page
    assert (site / "vendor/mermaid/LICENSE").is_file()
