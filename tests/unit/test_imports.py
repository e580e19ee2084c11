"""No import cycle in the `scheduler` package.

The graph is grimp's (import-linter's graph library), built from the source. What
counts as an import of one module by another:

- every `import` and `from ... import` statement, at module level or inside a function:
  a lazy import runs too, only later, and still ties the two modules together;
- not those under `if TYPE_CHECKING:`, which never run, so a cycle only through them
  is harmless at run time (they exist for annotations) and is not one here;
- not the implicit import of a package's `__init__` when one of its modules is
  imported: grimp does not record it, so a module may import its own package's siblings
  while the package's `__init__` imports it.
"""

from __future__ import annotations

import grimp

PACKAGE = "scheduler"


def import_cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """The shortest cycle through each module that is on one, each cycle once: the modules
    in import order, the first repeated at the end."""
    cycles: dict[frozenset[str], tuple[str, ...]] = {}
    for module in sorted(graph.modules):
        shortest: tuple[str, ...] | None = None
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module, as_packages=False)
            if back is not None and (shortest is None or len(back) + 1 < len(shortest)):
                shortest = (module, *back)
        if shortest is not None:
            cycles.setdefault(frozenset(shortest), shortest)
    return list(cycles.values())


def test_the_package_has_no_import_cycle() -> None:
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=True, cache_dir=None)
    assert len(graph.modules) > 50  # the whole package was read
    cycles = import_cycles(graph)
    assert not cycles, "import cycles in the package:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_a_cycle_is_found_and_named() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("p.cli", "p.commands"), ("p.commands", "p.options"), ("p.commands", "p.cli"),
                               ("p.options", "p.model")]:
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph) == [("p.cli", "p.commands", "p.cli")]
