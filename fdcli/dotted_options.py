"""vLLM's FlexibleArgumentParser forms, before click parses (stdlib only: the CLI stays light).

- The dotted form of a JSON-object option: `--structured-outputs-config.backend guidance` is
  `--structured-outputs-config '{"backend": "guidance"}'` (vLLM's docs launch structured outputs so).
  Keys nest (`--opt.a.b 1`), a value is JSON when it parses as JSON and text otherwise, `--opt.key+ a,b`
  gives a list, and every dotted key of one option joins one object, which takes the place of the
  option's first dotted key. The keys are laid over an object given whole (`--opt '{...}'`, which is
  then dropped from its place), where vLLM would drop that object.
- `-O3`, `-O 3`, `-O=3`: `--optimization-level 3`; `-O.key v`: a `--compilation-config` key.
"""

from __future__ import annotations

import json
from typing import Any

OPTIMIZATION_FLAG = "--optimization-level"


def dotted_argv(args: list[str], json_flags: frozenset[str]) -> list[str]:
    """`args` with the dotted keys of each of `json_flags` folded into that option's JSON, and vLLM's -O
    forms spelled out. ValueError (a usage error's one line) for a dotted key of an option that takes no
    JSON object, a dotted option without a value, or an empty key. Everything after `--` is left alone."""
    out: list[str] = []
    built: dict[str, dict[str, Any]] = {}
    slots: dict[str, list[str]] = {}  # each folded option's place in `out`: a list spliced in at the end
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        if arg.startswith("-O") and arg != "-O" and not arg.startswith("-O."):
            out += [OPTIMIZATION_FLAG, arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append(OPTIMIZATION_FLAG)
        elif arg.startswith("-O."):
            args = [*args[:i], "--compilation-config" + arg[2:], *args[i + 1 :]]
            continue
        elif arg.startswith("--") and "." in arg.partition("=")[0]:
            name, eq, text = arg.partition("=")
            flag, *keys = name.split(".")
            flag = flag.replace("_", "-")
            if flag not in json_flags:
                raise ValueError(f"{flag} does not take a JSON object, so {name} is not an option")
            if not eq:
                if i + 1 >= len(args):
                    raise ValueError(f"Option '{name}' requires an argument.")  # click's wording
                i += 1
                text = args[i]
            is_list = keys[-1].endswith("+")
            if is_list:
                keys[-1] = keys[-1][:-1]
            if not all(keys):
                raise ValueError(f"{name}: name a key after each dot, as {flag}.key VALUE")
            value = _value(text, is_list)
            for key in reversed(keys):
                value = {key: value}
            if flag not in built:
                built[flag], slots[flag] = {}, [flag]
                out.append(slots[flag])  # type: ignore[arg-type]
            _merge(built[flag], value)
        else:
            out.append(arg)
        i += 1
    for flag, obj in built.items():
        slots[flag].append(json.dumps(_over_whole(out, flag, obj)))
    return [word for item in out for word in (item if isinstance(item, list) else [item])]


def _value(text: str, is_list: bool) -> Any:
    if is_list:
        return text.split(",")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _over_whole(out: list, flag: str, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` laid over `flag`'s last whole-object value in `out`, which is removed from there."""
    at = [j for j, a in enumerate(out) if isinstance(a, str) and (a == flag or a.startswith(flag + "="))]
    if at:
        j = at[-1]
        inline = "=" in out[j]
        given = out[j].partition("=")[2] if inline else (out[j + 1] if j + 1 < len(out) else "")
        try:
            whole = json.loads(given)
        except ValueError:
            whole = None
        if isinstance(whole, dict):
            _merge(whole, obj)
            obj = whole
        del out[j : j + (1 if inline else 2)]
    return obj


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
