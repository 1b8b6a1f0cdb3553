"""vLLM's dotted form of a JSON-object option: `--structured-outputs-config.backend guidance` is
`--structured-outputs-config '{"backend": "guidance"}'` (vLLM's FlexibleArgumentParser; its docs
launch structured outputs so). Keys nest (`--opt.a.b 1`), a value is JSON when it parses as JSON and
text otherwise, `--opt.key+ a,b` gives a list, and every dotted key of one option joins one object,
passed on as that option's JSON where the option first appears. Stdlib only (the CLI stays light).

The option itself given as JSON too would be dropped silently by vLLM (its parser keeps the last);
here it is an error, as is a dotted name with an empty key.
"""

from __future__ import annotations

import json
from typing import Any


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """`update` laid into `into`: objects merge key by key, lists extend, anything else replaces."""
    for key, value in update.items():
        old = into.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _merge(old, value)
        elif isinstance(value, list) and isinstance(old, list):
            old.extend(value)
        else:
            into[key] = value


def _value(text: str, is_list: bool) -> Any:
    if is_list:
        return text.split(",")
    try:
        return json.loads(text)
    except ValueError:
        return text


def expand_dotted_options(args: list[str]) -> list[str]:
    """`args` with every `--opt.key[.key...][+] VALUE` (or `=VALUE`) folded into one `--opt JSON`;
    underscores in `opt` become dashes (vLLM's rule; keys are kept as written). ValueError, a usage
    error's one line, for a dotted option without a value or an empty key, or an option given both ways."""
    out: list[str] = []
    objects: dict[str, dict[str, Any]] = {}
    slots: dict[str, int] = {}  # where in `out` each option's JSON goes
    plain: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":  # everything after it is an argument, not an option
            out += args[i:]
            break
        name, eq, text = arg.partition("=")
        if not arg.startswith("--") or "." not in name:
            if arg.startswith("--"):
                plain.add(name.replace("_", "-"))
            out.append(arg)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args):
                raise ValueError(f"Option '{name}' requires an argument.")  # click's wording
            text = args[i + 1]
            i += 1
        option, *keys = name.split(".")
        option = option.replace("_", "-")
        is_list = keys[-1].endswith("+")
        if is_list:
            keys[-1] = keys[-1][:-1]
        if not all(keys):
            raise ValueError(f"{name}: name a key after each dot, as {option}.key VALUE")
        value = _value(text, is_list)
        for key in reversed(keys):
            value = {key: value}
        if option not in objects:
            objects[option] = {}
            out.append(option)
            slots[option] = len(out)
            out.append("")  # the object's JSON, once every key is read
        _merge(objects[option], value)
        i += 1
    both = sorted(plain & set(objects))
    if both:
        raise ValueError(
            f"{both[0]} is given as JSON and as dotted keys ({both[0]}.KEY VALUE): give one form"
        )
    for option, slot in slots.items():
        out[slot] = json.dumps(objects[option])
    return out
