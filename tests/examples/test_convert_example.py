"""examples/convert_and_inspect.py: convert a CSV, inspect it, decode the records exactly."""

from __future__ import annotations

import sys

from test_elastic_examples import EXAMPLES, run


def test_the_example_converts_inspects_and_decodes_exactly():
    [result] = run([sys.executable, str(EXAMPLES / "convert_and_inspect.py")])
    assert result["records"] == 25 and result["shards"] == ["data-00000", "data-00001", "data-00002"]
    assert result["exact"] is True and result["cities"] == ["Lima", "Oslo"]
