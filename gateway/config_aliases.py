"""YAML aliases that make a config infinite or exponentially large, found on the composed
node graph before anything walks the document."""

from __future__ import annotations

import yaml

# Values a config may spell out through aliases: the shipped one has a few hundred.
_MAX_EXPANDED = 100_000


def alias_issue(node: yaml.Node) -> tuple[int, str] | None:
    """An alias inside the node it names (`a: &a [*a]`) makes the document infinite, and
    aliases of aliases (`b: &b [*a, *a, ...]`, nested) make it exponentially large: every walk
    of the tree (line index, interpolation, validation) would recurse without end or run for
    ever. Said as a config error instead: (line, message)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        n, done = stack.pop()
        children: list[yaml.Node] = []
        if isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        elif isinstance(n, yaml.SequenceNode):
            children = list(n.value)
        if done:
            open_.discard(id(n))
            sizes[id(n)] = min(_MAX_EXPANDED + 1, 1 + sum(sizes[id(c)] for c in children))
            if sizes[id(n)] > _MAX_EXPANDED:
                line = n.start_mark.line + 1
                return line, f"YAML aliases expand this document past {_MAX_EXPANDED:,} values"
            continue
        if id(n) in sizes:
            continue
        open_.add(id(n))
        stack.append((n, True))
        for c in children:
            if id(c) in open_:
                return c.start_mark.line + 1, "a YAML alias refers to a node that contains it"
            if id(c) not in sizes:
                stack.append((c, False))
    return None
