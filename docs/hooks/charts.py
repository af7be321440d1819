"""An mkdocs hook that publishes the committed benchmark charts (``benchmarks/results/*/*.png``).

The charts stay where the benchmarks write them; the site serves each one as
``benchmarks/<profile>/<name>.png``, so ``docs/development/benchmarks.md`` links them as
``../benchmarks/<profile>/<name>.png`` and a strict build fails if one goes missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def chart_paths(results: Path = RESULTS) -> dict[str, Path]:
    """Site path -> chart file, for every committed chart (one folder per store profile)."""
    return {
        f"benchmarks/{png.parent.name}/{png.name}": png for png in sorted(results.glob("*/*.png"))
    }


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """Add the charts to the site's files."""
    from mkdocs.structure.files import File  # noqa: PLC0415 (mkdocs only when building)

    for src_uri, path in chart_paths().items():
        files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files
