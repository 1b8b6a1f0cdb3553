"""Which field of a JSON body nests too deep to parse: the body parser's recursion limit fails the
whole request with a generic error, and a client (a 10^4-deep JSON schema, say) should see the field.

Used on the error path only, over a body that already failed to parse; a linear scan of its tokens,
bounded in the bytes it reads.
"""

from __future__ import annotations

import re

# Nesting beyond this is what made the parse fail (the parser's limit is near Python's recursion limit).
DEEP = 500
SCAN_BYTES = 4 << 20
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:]')


def too_deep_field(body: bytes, deep: int = DEEP) -> str | None:
    """The dotted path of object keys (at most three) to the first container nested deeper than
    `deep`, or None when nothing in the scanned prefix is that deep."""
    stack: list[str | None] = []  # per open container: the key being filled (objects) or None
    last: str | None = None
    for m in _TOKEN.finditer(body, 0, min(len(body), SCAN_BYTES)):
        tok = m.group()
        if tok in (b"{", b"["):
            stack.append(None)
            if len(stack) > deep:
                keys = [k for k in stack if k is not None][:3]
                return ".".join(keys) or None
        elif tok in (b"}", b"]"):
            if stack:
                stack.pop()
        elif tok == b":":
            if stack and last is not None:
                stack[-1] = last
        else:
            last = tok[1:-1].decode("utf-8", "replace")
    return None
