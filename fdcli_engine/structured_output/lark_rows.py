"""Whether a Lark grammar makes llguidance's Earley parser predict more alternatives at once than a
row of the parser holds.

Predicting a rule puts one item per alternative in the parser's current row, and with it every
alternative of the rules (and parenthesised groups) that can start one of those alternatives.
llguidance checks the row's size (its max_items_in_row) only after each token it consumes: such a
grammar compiles, then fails at the first token that ends inside that row, and the request ends
there. This count lets the backend refuse it up front instead.

The count is a lower bound, so a grammar is not refused for items it would not make: only the
alternatives of rules and groups are counted (not the helper rules of quantifiers), only the first
item of an alternative (and those after an optional one) starts it, and a grammar read_lark does
not read gives None.
"""

from __future__ import annotations

from fdcli_engine.structured_output.lark_check import read_lark

# Past this many steps of the walk the answer is None ("unknown"): the walk must stay cheap next to
# llguidance's own compile, whatever the grammar.
WALK_BUDGET = 500_000


def _is_terminal(name: str) -> bool:
    return name.lstrip("_")[:1].isupper()


def _graph(parsed: dict[str, list]) -> tuple[dict[str, int], dict[str, list[str]], dict[str, list[str]]]:
    """Per node (a rule, or a group as "name#k"): its number of alternatives, the nodes that can
    start one of them, and every node it uses anywhere (for reachability from start)."""
    size: dict[str, int] = {}
    first: dict[str, list[str]] = {}
    used: dict[str, list[str]] = {}

    def node(name: str, alts: list) -> None:
        size[name] = len(alts)
        first[name], used[name] = [], []
        for seq in alts:
            leading = True
            for item in seq:
                optional = item[0] == "opt"
                target = target_of(name, item[1] if optional else item)
                if target is not None:
                    used[name].append(target)
                    if leading:
                        first[name].append(target)
                group = item[1] if optional else item
                leading = leading and (optional or (group[0] == "group" and group[2]))

    def target_of(owner: str, item: tuple) -> str | None:
        if item[0] == "name":
            return item[1] if item[1] in parsed and not _is_terminal(item[1]) else None
        if item[0] == "group":
            sub = f"{owner}#{len(size)}"
            node(sub, item[1])
            return sub
        return None

    for name, alts in parsed.items():
        if not _is_terminal(name):
            node(name, alts)
    return size, first, used


def _components(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative), each after every component it reaches."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            children = edges[v]
            if i < len(children):
                work.append((v, i + 1))
                w = children[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def crowded_rule(grammar: str | dict[str, list] | None, limit: int) -> tuple[str, int] | None:
    """(rule, items) for a rule reachable from start whose prediction puts more than `limit` items
    in one row (at least `items`); None when there is none or the grammar is not read. `grammar`: its
    text, or read_lark's reading of it."""
    parsed = read_lark(grammar) if isinstance(grammar, str) else grammar
    if parsed is None:
        return None
    try:
        size, first, used = _graph(parsed)
    except RecursionError:  # groups nested as deep as read_lark could go: llguidance's limit says it
        return None
    reachable, todo = {"start"}, ["start"]
    while todo:
        for nxt in used[todo.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                todo.append(nxt)
    if sum(size[n] for n in reachable) <= limit:
        return None
    # Per component of the "can start" graph, bounds on what predicting any of its nodes puts in a row:
    # its own alternatives plus those of the largest (lower) or of every (upper) component it reaches.
    comp_of: dict[str, int] = {}
    lower: list[int] = []
    upper: list[int] = []
    comps = _components(sorted(reachable), first)
    for k, comp in enumerate(comps):
        for n in comp:
            comp_of[n] = k
        succ = {comp_of[m] for n in comp for m in first[n]} - {k}
        own = sum(size[n] for n in comp)
        lower.append(own + max((lower[j] for j in succ), default=0))
        upper.append(own + sum(upper[j] for j in succ))
        if lower[k] > limit:
            return _owner(comp), lower[k]
    budget = WALK_BUDGET
    for k, comp in enumerate(comps):
        if upper[k] <= limit:
            continue
        seen, todo = {comp[0]}, [comp[0]]
        while todo:
            for nxt in first[todo.pop()]:
                budget -= 1
                if budget < 0:
                    return None
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        items = sum(size[n] for n in seen)
        if items > limit:
            return _owner(comp), items
    return None


def _owner(comp: list[str]) -> str:
    """The component's rule to name in an error: a named rule, else the rule a group belongs to."""
    return min(n.split("#", 1)[0] for n in comp)
