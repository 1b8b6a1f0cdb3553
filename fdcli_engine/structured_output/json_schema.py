"""Closed objects: an object schema that lists `properties` and says nothing of other keys allows no
other keys, as xgrammar's strict mode (vLLM's and FastDeploy's default backend) reads it. JSON Schema
itself would allow any extra key, which lets a small model wander off into keys of its own until
max_tokens; a schema that wants extra keys says `additionalProperties` (or `patternProperties`,
`unevaluatedProperties`) and keeps its meaning.
"""

from __future__ import annotations

from typing import Any

# Keywords whose value maps names to subschemas (the map itself is not a schema).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_objects(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` added to every object schema that has `properties`
    and none of _OPEN_KEYWORDS; changed in place (iterative: any depth) and returned."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if "properties" in node and not any(k in node for k in _OPEN_KEYWORDS):
            node["additionalProperties"] = False
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in ("enum", "const", "default", "examples") and isinstance(value, (dict, list)):
                stack.append(value)
    return schema
