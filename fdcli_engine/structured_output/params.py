"""What a constrained request asks for: exactly one of a JSON schema, a regex, a list of choices, a
grammar, "any JSON object" or a structural tag (vLLM's `StructuredOutputsParams` names). Leaf module.

The serving layer maps every request form onto this (OpenAI's `response_format`, vLLM's
`structured_outputs` and `guided_*`, FastDeploy's `guided_*`, tool_choice "required" / named); the
engine compiles it with its grammar backend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fdcli_engine.errors import InvalidRequestError

# The constraint kinds, in the order they are reported.
CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | None = None  # a JSON schema, serialized (a dict is serialized by __post_init__)
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark (llguidance's dialect) or GBNF / EBNF
    json_object: bool = False  # any JSON object (OpenAI's json_object)
    structural_tag: str | None = None  # vLLM's structural_tag, serialized JSON
    # vLLM's options next to the constraint, accepted so vLLM code constructs these unchanged; none
    # changes the grammar: JSON is always compact (as disable_any_whitespace asks), objects listing
    # `properties` are closed unless the schema opens them (json_schema.close_objects, what
    # disable_additional_properties asks), and there is one backend (no fallback). A whitespace
    # pattern is not honoured (compact JSON has no free whitespace).
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    # The constraint starts once the output ends with these tokens (a reasoning parser's end tag, so
    # the reasoning block stays free); empty: from the first generated token.
    start_after_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        try:
            if isinstance(self.json, (dict, list, bool)):
                self.json = json.dumps(self.json)
            if isinstance(self.structural_tag, (dict, list)):
                self.structural_tag = json.dumps(self.structural_tag)
        except (RecursionError, TypeError, ValueError) as exc:  # a 10^4-deep schema, a non-JSON value
            raise InvalidRequestError(
                f"the constraint is not serializable JSON: {type(exc).__name__}: {exc}",
                param="structured_outputs",
            ) from None
        given = self.given()
        if len(given) != 1:
            what = " and ".join(given) if given else "nothing"
            raise InvalidRequestError(
                f"structured outputs take exactly one constraint ({', '.join(CONSTRAINT_FIELDS)}); got {what}",
                param="structured_outputs",
            )

    def given(self) -> list[str]:
        return [
            name
            for name in CONSTRAINT_FIELDS
            if (
                getattr(self, name) is not False if name == "json_object" else getattr(self, name) is not None
            )
        ]

    @property
    def kind(self) -> str:
        """Which constraint this is (one of CONSTRAINT_FIELDS)."""
        return self.given()[0]

    @property
    def spec(self) -> str:
        """The constraint as text: the key of the compiled-grammar cache (with `kind`)."""
        value = getattr(self, self.kind)
        if self.kind == "choice":
            return json.dumps(value)
        return "" if self.kind == "json_object" else value
