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


# In an allOf branch, these make the names the other branches allow unknowable.
_OPAQUE_KEYWORDS = ("anyOf", "oneOf", "allOf", "$dynamicRef")


def _local_target(root: Any, ref: Any) -> dict | None:
    """The definition a local `#/$defs/NAME` (or `#/definitions/NAME`) ref names, else None."""
    if not isinstance(ref, str) or not isinstance(root, dict):
        return None
    for key in ("$defs", "definitions"):
        prefix = f"#/{key}/"
        defs = root.get(key)
        if ref.startswith(prefix) and isinstance(defs, dict):
            target = defs.get(ref[len(prefix) :])
            return target if isinstance(target, dict) else None
    return None


def _share_all_of_names(root: Any, node: dict, left_open: set[int]) -> None:
    """An object and its allOf branches describe one object: each may only be closed over the names
    they list together, else closing one branch forbids another's keys and the conjunction matches
    nothing. Every closable part (a branch, or the local definition a branch's $ref names) gets the
    others' names as `{}` (any value: the part that lists a name constrains it). When the names
    cannot be known (a branch with anyOf, a remote ref), the object and its parts stay open, as
    JSON Schema reads them (ids in `left_open`)."""
    parts = [node]
    for branch in node["allOf"]:
        if not isinstance(branch, dict):
            continue
        target = _local_target(root, branch["$ref"]) if "$ref" in branch else branch
        if target is None or any(k in target for k in _OPAQUE_KEYWORDS) or "$ref" in target:
            left_open.update(id(p) for p in [node, *parts, *node["allOf"]])
            return
        parts += [branch] if target is branch else [branch, target]
    names = [n for p in parts if isinstance(p.get("properties"), dict) for n in p["properties"]]
    for part in parts:
        props = part.get("properties")
        if isinstance(props, dict) and not any(k in part for k in _OPEN_KEYWORDS):
            for name in names:
                props.setdefault(name, {})


def _schemas(schema: Any):
    """Every subschema (dict) of `schema`, itself included; iterative, so any depth."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        yield node
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in ("enum", "const", "default", "examples") and isinstance(value, (dict, list)):
                stack.append(value)


def close_objects(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` added to every object schema that has `properties`
    and none of _OPEN_KEYWORDS; changed in place and returned. An object with allOf is closed over
    the names of all its parts (_share_all_of_names, first, while every part is as written)."""
    left_open: set[int] = set()
    for node in list(_schemas(schema)):
        if isinstance(node.get("allOf"), list):
            _share_all_of_names(schema, node, left_open)
    for node in _schemas(schema):
        if "properties" in node and not any(k in node for k in _OPEN_KEYWORDS) and id(node) not in left_open:
            node["additionalProperties"] = False
    return schema
