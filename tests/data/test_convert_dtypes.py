"""`flextrain data convert` names what a NumPy dtype it refuses probably is, and what to do.

The .npy format has no name for ml_dtypes' types: a bfloat16 array is saved with the header
descr '<V2' and loads as a 2-byte void (``|V2``), with or without ml_dtypes. Refused as
"dtype |V2" alone, the user could not tell why.
"""

from __future__ import annotations

import numpy as np
import pytest

from flextrain.data.convert import ConvertOptions, convert
from flextrain.data.errors import DataError


def refusal(tmp_path, name: str) -> str:
    out = tmp_path / f"out-{name}"
    with pytest.raises(DataError) as info:
        convert(tmp_path / name, out, ConvertOptions())
    assert not out.exists() or not any(out.iterdir())  # nothing written
    return str(info.value)


def test_a_bfloat16_npy_is_named_with_the_cure(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.save(tmp_path / "bf.npy", x.astype(ml_dtypes.bfloat16))
    assert b"'descr': '<V2'" in (tmp_path / "bf.npy").read_bytes()[:128]  # all the file says of its type
    text = refusal(tmp_path, "bf.npy")
    assert text.startswith(f"{tmp_path / 'bf.npy'}: array 'x' has dtype |V2 (a 2-byte void dtype: probably "
                           "bfloat16 saved with ml_dtypes")
    assert text.endswith("bfloat16 .npy (ml_dtypes) is not supported; convert it to float32 first: "
                         "np.save(path, array.view(ml_dtypes.bfloat16).astype(np.float32))")
    # the cure as given works
    np.save(tmp_path / "bf.npy", np.load(tmp_path / "bf.npy").view(ml_dtypes.bfloat16).astype(np.float32))
    assert convert(tmp_path / "bf.npy", tmp_path / "out", ConvertOptions()).schema.records == 3
    np.savez(tmp_path / "bf.npz", w=x.astype(ml_dtypes.bfloat16), y=np.arange(3))
    assert "array 'w' has dtype |V2 (a 2-byte void dtype: probably bfloat16" in refusal(tmp_path, "bf.npz")


def test_other_void_and_structured_dtypes_are_described(tmp_path):
    np.save(tmp_path / "v1.npy", np.zeros(4, dtype="V1"))  # what a float8 array of ml_dtypes loads as
    assert "|V1 (a 1-byte void dtype: probably a float8 or int4 type saved with ml_dtypes)" in refusal(tmp_path,
                                                                                                     "v1.npy")
    np.save(tmp_path / "v8.npy", np.zeros(4, dtype="V8"))
    assert "|V8 (a 8-byte void dtype: raw bytes), which flextrain records do not hold" in refusal(tmp_path, "v8.npy")
    np.save(tmp_path / "st.npy", np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8")]))
    assert refusal(tmp_path, "st.npy").endswith("(a structured array, fields a, b), which flextrain records do not "
                                                "hold (one of bool, int8, int16, int32, int64, uint8, uint16, "
                                                "uint32, uint64, float16, float32, float64, or str/bytes): save "
                                                "each field as its own array of an .npz")
