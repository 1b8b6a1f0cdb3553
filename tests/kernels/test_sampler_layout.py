"""The sampler's row layout is written once in Python (fd_kernels.sampler_layout) and once in C++
(csrc/sampler.h's enums): the two must name the same columns in the same order, or the kernel reads one
parameter as another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fd_kernels import sampler_layout

SAMPLER_H = Path(sampler_layout.__file__).resolve().parent / "csrc" / "sampler.h"


def cpp_enum(name: str) -> list[str]:
    """The enumerators of `enum name { ... }` in sampler.h, in order, comments stripped."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", SAMPLER_H.read_text(), flags=re.S)
    match = re.search(rf"\benum\s+{name}\s*\{{([^}}]*)\}}", text)
    assert match, f"enum {name} not found in {SAMPLER_H}"
    entries = [e.strip() for e in match.group(1).split(",") if e.strip()]
    names = [e.split("=")[0].strip() for e in entries]
    # Only the first enumerator may be given a value (0): the rest follow it one by one.
    assert entries[0].replace(" ", "") == f"{names[0]}=0", entries[0]
    assert all("=" not in e for e in entries[1:]), entries
    return names


def cpp_name(column: str) -> str:
    return "k" + "".join(part.capitalize() for part in column.split("_"))


@pytest.mark.parametrize(
    "enum,columns,count",
    [
        ("SampleParam", sampler_layout.PARAM_COLUMNS, "kNumSampleParams"),
        ("SampleMeta", sampler_layout.META_COLUMNS, "kNumSampleMeta"),
    ],
)
def test_cpp_enum_matches_the_python_columns(enum, columns, count):
    names = cpp_enum(enum)
    assert names[-1] == count  # the width, after the columns
    assert names[:-1] == [cpp_name(c) for c in columns]


def test_the_named_rows_follow_the_columns():
    assert sampler_layout.ParamRow._fields == sampler_layout.PARAM_COLUMNS
    assert sampler_layout.MetaRow._fields == sampler_layout.META_COLUMNS
