"""models/jsontext.loads: orjson's speed, the standard library's meaning."""

import json
import math

import pytest

from models.jsontext import loads

SAME = [
    b'{"a": 1, "a": 2}',  # duplicate keys: the last wins in both
    b'{"x": -0.0, "y": 1e-320, "z": 0.1, "w": 123456789.123456789, "v": -0}',
    '{"t": "caf\\u00e9 \\ud83d\\ude00 \\n\\t", "u": "\u00e9\u4e2d"}'.encode(),
    b'[1, 2.5, "s", null, true, false, {}, []]\n',
    b'  {"k": {"nested": [{"deep": 9223372036854775807}]}}  ',
]


@pytest.mark.parametrize("text", SAME)
def test_values_equal_the_standard_librarys(text):
    assert loads(text) == json.loads(text)
    assert loads(text.decode()) == json.loads(text.decode())


def test_what_only_json_reads_still_reads():
    assert math.isnan(loads(b'{"m": NaN}')["m"])
    assert loads(b'{"m": Infinity}')["m"] == math.inf
    assert loads(b'{"n": 123456789012345678901234567890}')["n"] == 123456789012345678901234567890
    assert loads(b'"\\ud800"') == "\ud800"  # a lone surrogate
    assert loads('{"a": 1}'.encode("utf-16")) == {"a": 1}


def test_invalid_text_raises_the_standard_librarys_error():
    with pytest.raises(json.JSONDecodeError) as e:
        loads(b'{"a": 1,')
    with pytest.raises(json.JSONDecodeError) as f:
        json.loads(b'{"a": 1,')
    assert (e.value.msg, e.value.pos) == (f.value.msg, f.value.pos)
    with pytest.raises(UnicodeDecodeError):
        loads(b'{"a": "\xff"}')


@pytest.mark.parametrize("n", [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30])
def test_integers_at_and_beyond_64_bits_stay_exact(n):
    for text in (f'{{"n": {n}}}', f'[{n}, "x"]'):
        assert loads(text.encode()) == json.loads(text) and type(loads(text)["n" if text[0] == "{" else 0]) is int
