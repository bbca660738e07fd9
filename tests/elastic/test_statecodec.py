"""The pickle-free state codec (JSON skeleton + raw tensor bytes)."""

from __future__ import annotations

import enum
import json
import pickle
import struct
from collections import OrderedDict

import pytest
import torch

from flextrain.elastic import statecodec
from flextrain.elastic.statecodec import (StateCodecError, decode, encode, encode_indexed, nonfinite, nonfinite_blob,
                                          nonfinite_encoded)


def assert_same(a, b, path="root"):
    """Structural equality that also checks container types, key types and dtypes."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            assert type(key) is type(list(b)[list(a).index(key)]), f"{path}: key type of {key!r}"
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))


def trained_adam(model):
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    model(torch.randn(5, 4)).pow(2).sum().backward()
    opt.step()
    return opt


def test_model_state_dict_round_trip():
    model = small_model()
    model.train()
    model(torch.randn(6, 4))  # update BatchNorm running stats and num_batches_tracked
    state = model.state_dict()
    back = decode(encode(state))
    assert_same(dict(state), back)
    assert back["1.num_batches_tracked"].dtype == torch.int64
    assert back["1.num_batches_tracked"].dim() == 0
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    fresh.load_state_dict(back)
    x = torch.randn(3, 4)
    model.eval(), fresh.eval()
    assert torch.equal(model(x), fresh(x))


def test_adam_state_round_trip_int_keys_tuples_and_loading():
    model = small_model()
    opt = trained_adam(model)
    state = opt.state_dict()
    back = decode(encode(state))
    assert_same(state, back)
    assert all(isinstance(k, int) for k in back["state"])
    assert isinstance(back["param_groups"][0]["betas"], tuple)
    assert back["state"][0]["step"].dim() == 0

    model2 = small_model()
    model2.load_state_dict(model.state_dict())
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    opt2.load_state_dict(back)
    assert opt2.param_groups[0]["lr"] == 0.01
    assert opt2.param_groups[0]["betas"] == (0.8, 0.99)
    # the same next step from both optimizers gives the same parameters
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_dtypes_shapes_and_scalars_round_trip():
    tree = {
        "bf16": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "f16": torch.tensor([[0.5, 1.0]], dtype=torch.float16),
        "f64": torch.tensor(3.141592653589793, dtype=torch.float64),
        "i64": torch.tensor([-(2**62), 0, 2**62], dtype=torch.int64),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([[True, False], [False, True]]),
        "scalar_bool": torch.tensor(True),
        "scalar_i64": torch.tensor(7),
        "c64": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        "noncontig": torch.arange(12.0).reshape(3, 4).t(),
        7: "int key",
        "7": "str key that looks like an int",
        "nested": [1, 2.5, None, True, "s", (1, (2, [3])), {"x": torch.ones(1)}],
        "tuple": (torch.zeros(2), 0.1),
        "big": 2**70,
        "floats": [float("inf"), -0.0, 1e-300],
    }
    back = decode(encode(tree))
    expected = dict(tree)
    expected["noncontig"] = tree["noncontig"].contiguous()
    assert_same(expected, back)
    assert back[7] == "int key" and back["7"] == "str key that looks like an int"
    assert torch.equal(back["noncontig"], tree["noncontig"])


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)])
def test_empty_tensor_round_trip(shape):
    tree = {"empty": torch.zeros(shape), "after": torch.arange(3)}
    back = decode(encode(tree))
    assert_same(tree, back)


def test_decoded_tensors_are_independent_and_writable():
    src = {"w": torch.ones(3)}
    blob = bytearray(encode(src))
    back = decode(blob)
    back["w"] += 1  # writable
    blob[-4:] = b"\x00\x00\x00\x00"  # mutating the buffer later does not change the tensor
    assert torch.equal(back["w"], torch.full((3,), 2.0))
    assert torch.equal(src["w"], torch.ones(3))


def test_decode_accepts_memoryview_and_bytearray():
    blob = encode({"a": torch.arange(4)})
    for data in (blob, bytearray(blob), memoryview(blob)):
        assert torch.equal(decode(data)["a"], torch.arange(4))


@pytest.mark.parametrize(
    "tree",
    [
        {(1, 2): 1},          # tuple key
        {True: 1},            # bool key (would come back as an int)
        {"s": {1, 2}},        # set
        {"o": object()},
        {"b": b"bytes"},
    ],
)
def test_encode_rejects_what_it_cannot_represent(tree):
    with pytest.raises(StateCodecError):
        encode(tree)


def test_encode_rejects_unsupported_dtype():
    uint16 = getattr(torch, "uint16", None)
    if uint16 is None:
        pytest.skip("torch has no uint16")
    with pytest.raises(StateCodecError, match="dtype"):
        encode({"t": torch.zeros(2, dtype=uint16)})


# ---- corrupt input -------------------------------------------------------------
def _blob():
    return encode({"a": torch.arange(10, dtype=torch.float32), "b": [torch.ones(2, 2, dtype=torch.int64)]})


def _header_len(blob: bytes) -> int:
    return struct.unpack_from("<4sIQ", blob, 0)[2]


@pytest.mark.parametrize("cut", [0, 1, 8, 15])
def test_too_short_raises(cut):
    with pytest.raises(StateCodecError):
        decode(_blob()[:cut])


def test_bad_magic_and_version_raise():
    blob = _blob()
    with pytest.raises(StateCodecError, match="not a flextrain state blob"):
        decode(b"XXXX" + blob[4:])
    with pytest.raises(StateCodecError, match="not a flextrain state blob"):
        decode(blob[:4] + struct.pack("<I", 99) + blob[8:])
    with pytest.raises(StateCodecError):
        decode(pickle.dumps({"a": 1}))


def test_truncated_header_raises():
    blob = _blob()
    with pytest.raises(StateCodecError, match="truncated"):
        decode(blob[: 16 + _header_len(blob) - 1])


@pytest.mark.parametrize("missing", [1, 4, 16, 40])
def test_truncated_tensor_data_raises(missing):
    blob = _blob()
    assert len(blob) - missing > 16 + _header_len(blob)
    with pytest.raises(StateCodecError, match="truncated"):
        decode(blob[:-missing])


def test_header_length_beyond_blob_raises():
    blob = _blob()
    with pytest.raises(StateCodecError):
        decode(blob[:8] + struct.pack("<Q", 2**40) + blob[16:])


@pytest.mark.parametrize("corrupt", ["invalid_utf8", "invalid_json", "wrong_schema", "nbytes_shape_mismatch"])
def test_corrupt_header_raises_state_codec_error(corrupt):
    import json

    blob = _blob()
    hl = _header_len(blob)
    header, rest = blob[16 : 16 + hl], blob[16 + hl :]
    if corrupt == "invalid_utf8":
        header = b"\xff" + header[1:]
    elif corrupt == "invalid_json":
        header = header[:-1] + b"?"
    elif corrupt == "wrong_schema":
        header = json.dumps({"tree": {"t": 0}}).encode()  # no "tensors"
    else:
        doc = json.loads(header)
        doc["tensors"][0]["shape"] = [3]  # 40 bytes cannot be a float32 tensor of shape [3]
        header = json.dumps(doc).encode()
    blob = blob[:8] + struct.pack("<Q", len(header)) + header + rest
    with pytest.raises(StateCodecError):
        decode(blob)


# ---- never pickle ----------------------------------------------------------------
def test_decode_never_unpickles(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("decode must not unpickle")

    class NoUnpickler:
        def __init__(self, *args, **kwargs):
            boom()

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "Unpickler", NoUnpickler)
    monkeypatch.setattr(torch, "load", boom)
    model = small_model()
    opt = trained_adam(model)
    tree = {"model": model.state_dict(), "optimizer": opt.state_dict(), "version": 3}
    blob = encode(tree)
    back = decode(blob)
    assert back["version"] == 3
    assert_same(tree["optimizer"], back["optimizer"])
    assert not hasattr(statecodec, "pickle")


def test_nonfinite_blob_finds_what_nonfinite_finds_without_building_tensors():
    """The flash writer's check, read in place: every float dtype (bfloat16 by its bits), nested lists,
    integers ignored, and only the entry asked for (the optimizer's NaN is not the model's)."""
    nan, inf = float("nan"), float("inf")
    model = {
        "a": torch.randn(3, 4),
        "b": torch.tensor([1.0, nan, inf, -inf], dtype=torch.bfloat16),
        "c": torch.tensor([inf, 2.0], dtype=torch.float16),
        "d": torch.arange(3),
        "e": [torch.tensor([nan], dtype=torch.float64)],
        "f": torch.tensor([complex(nan, 0)], dtype=torch.complex64),
        "g": torch.empty(0),
    }
    blob = encode({"model": model, "optimizer": {"x": torch.tensor([nan])}, "version": 1})
    expected = ["b (1 NaN, 2 inf of 4)", "c (1 inf of 2)", "e[0] (1 NaN of 1)", "f (1 NaN of 1)"]
    assert nonfinite(decode(blob)["model"]) == expected == nonfinite_blob(blob)
    assert nonfinite_blob(blob, limit=2) == expected[:2]
    assert nonfinite_blob(encode({"model": {"w": torch.ones(2)}, "version": 1})) == []
    with pytest.raises(StateCodecError, match="checksum"):
        nonfinite_blob(blob[:-1] + bytes([blob[-1] ^ 1]))


def reference_header(tree) -> bytes:
    """The header as ``json.dumps`` of a skeleton of dicts gives it (what encode wrote before it wrote
    the JSON itself as it walks): encode must give these bytes."""
    metas = []

    def walk(node):
        if isinstance(node, torch.Tensor):
            t = node.detach().contiguous()
            metas.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                          "nbytes": t.numel() * t.element_size()})
            return {"t": len(metas) - 1}
        if isinstance(node, dict):
            return {"d": [[key, walk(value)] for key, value in node.items()]}
        if isinstance(node, (list, tuple)):
            return {"u" if isinstance(node, tuple) else "l": [walk(v) for v in node]}
        return {"v": node}

    return json.dumps({"tree": walk(tree), "tensors": metas}).encode()


class Kind(enum.IntEnum):
    A = 3


class Mapping(dict):
    pass


TRICKY = {7: "int key", "7": "s", "u": "\u00fcn\u00ef\n\"q\\", "\u00e9": 1, "big": 2**70, Kind.A: Kind.A,
          "f": [float("inf"), -float("inf"), float("nan"), -0.0, 1e-300, 1e22, 0.1, True, False, None],
          "m": Mapping(x=(torch.zeros(2), [])), "o": OrderedDict(b={}), "e": torch.empty(0, 3),
          "p": torch.nn.Parameter(torch.ones(2)), "bf": torch.ones(3, dtype=torch.bfloat16), "c": torch.tensor([1j])}


def test_encode_indexed_gives_the_header_as_built():
    """The header is json.dumps's bytes of the skeleton (every scalar kind, subclasses, escapes,
    NaN/inf); the metas and spans are what it says, so the writer need not parse it."""
    model = small_model()
    opt = trained_adam(model)
    for tree in ({"model": model.state_dict(), "optimizer": opt.state_dict(), "version": 7}, TRICKY,
                 [1, {"a": torch.ones(1)}], {}, 2.5):
        enc = encode_indexed(tree)
        assert enc.data == encode(tree)
        header_len = struct.unpack_from("<Q", enc.data, 8)[0]
        assert enc.start == 16 + header_len
        assert enc.data[16:enc.start] == reference_header(tree)
        tensors = json.loads(enc.data[16:enc.start])["tensors"]
        assert [(m["dtype"], m["nbytes"], m["shape"]) for m in tensors] == [tuple(m) for m in enc.metas]
        assert sum(m[1] for m in enc.metas) == len(enc.data) - enc.start - 4
    enc = encode_indexed({"model": model.state_dict(), "optimizer": opt.state_dict(), "version": 7})
    n_model, n_opt = len(model.state_dict()), 3 * len(opt.state_dict()["state"])  # Adam: step, two moments
    assert enc.spans == {"model": (0, n_model), "optimizer": (n_model, n_model + n_opt),
                         "version": (n_model + n_opt,) * 2}
    assert encode_indexed([torch.ones(1)]).spans is None


def test_encode_dispatch_keeps_subclasses_and_checks_keys():
    """The walk dispatches on exact types first: subclasses (OrderedDict, a Parameter, an IntEnum, a
    dict subclass) and bad keys nested under a plain dict still take the checked path."""
    param = torch.nn.Parameter(torch.ones(2))
    tree = {"o": OrderedDict(a=1), "p": param, "k": Kind.A, "m": Mapping(x=torch.zeros(1)), "s": [True, 1.5]}
    back = decode(encode(tree))
    assert back["o"] == {"a": 1} and back["k"] == 3 and type(back["k"]) is int
    assert torch.equal(back["p"], torch.ones(2)) and not back["p"].requires_grad
    assert torch.equal(back["m"]["x"], torch.zeros(1)) and back["s"] == [True, 1.5]
    for bad in ({"n": {True: 1}}, {"n": {(1,): 1}}, {"n": [{2.5: 1}]}):
        with pytest.raises(StateCodecError, match="dict key"):
            encode(bad)


def test_version_and_lr_changes_are_encoded_every_time():
    """Nothing of one encode is reused by the next: a changed scalar (the version, an LR) is in the blob."""
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    first = decode(encode({"model": model.state_dict(), "optimizer": opt.state_dict(), "version": 1}))
    opt.param_groups[0]["lr"] = 0.05
    second = decode(encode({"model": model.state_dict(), "optimizer": opt.state_dict(), "version": 2}))
    assert (first["version"], first["optimizer"]["param_groups"][0]["lr"]) == (1, 0.1)
    assert (second["version"], second["optimizer"]["param_groups"][0]["lr"]) == (2, 0.05)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_nonfinite_encoded_checks_runs_of_tensors_and_names_the_bad_one(where):
    """The writer's check reads back-to-back tensors of one dtype in one pass; a NaN anywhere in such a
    run (or after an integer tensor breaks it) is still found and named, as by :func:`nonfinite_blob`."""
    model = {"a": torch.ones(3), "b": torch.ones(2, 2), "n": torch.arange(2), "c": torch.ones(4)}
    bad = {"first": "a", "middle": "b", "last": "c"}[where]
    model[bad] = model[bad].clone().reshape(-1)
    model[bad][1] = float("nan")
    enc = encode_indexed({"model": model, "version": 1})
    assert nonfinite_encoded(enc) == nonfinite_blob(enc.data) == [f"{bad} (1 NaN of {model[bad].numel()})"]
    clean = encode_indexed({"model": {"a": torch.ones(3), "n": torch.arange(2), "c": torch.ones(1)},
                            "optimizer": {"m": torch.tensor([float("inf")])}})
    assert nonfinite_encoded(clean) == [] == nonfinite_blob(clean.data)
