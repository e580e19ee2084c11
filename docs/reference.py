"""Writes the API reference at build time: one page per module of the `scheduler`
package, found by walking the package's files, and the reference's navigation
(`reference/SUMMARY.md`, read by mkdocs-literate-nav). Nothing here names a module, so
a module that is added, moved or split shows up in the next build as it then is.

Run by mkdocs-gen-files (see `mkdocs.yml`); the pages exist only in the build.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

PACKAGE = "scheduler"
ROOT = Path(__file__).resolve().parent.parent


def modules() -> list[tuple[str, ...]]:
    """The dotted names of every module of the package, as parts, in name order: so the
    package `scheduler` (the public API) comes first and each package before its modules.
    `__main__` (`python -m scheduler`) has no API of its own and is left out."""
    found = []
    for source in (ROOT / PACKAGE).rglob("*.py"):
        parts = source.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        found.append(parts[:-1] if parts[-1] == "__init__" else parts)
    return sorted(found)


def source_of(parts: tuple[str, ...]) -> Path:
    """The file a module is read from: `scheduler/worker/__init__.py` for a package."""
    package = Path(*parts, "__init__.py")
    return package if (ROOT / package).exists() else Path(*parts).with_suffix(".py")


nav = mkdocs_gen_files.Nav()
for parts in modules():
    source = source_of(parts)
    # scheduler/worker/index.md for the package, scheduler/worker/app.md for a module.
    page = source.with_name("index.md") if source.name == "__init__.py" else source.with_suffix(".md")
    nav[parts] = page.as_posix()
    name = ".".join(parts)
    with mkdocs_gen_files.open(Path("reference", page), "w") as out:
        out.write(f"---\ntitle: {name}\n---\n\n::: {name}\n")
    mkdocs_gen_files.set_edit_path(Path("reference", page), source)

with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as out:
    out.writelines(nav.build_literate_nav())
