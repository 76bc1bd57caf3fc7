"""Every bad call raises TypeError / ValueError with a clear message and never crashes."""

from __future__ import annotations

import edgeflash.kernels as K
import numpy as np
import pytest

Q = K.quantize(np.ones((4, 64), np.float32), "q4_0")
X = np.ones((2, 64), np.float32)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: K.matmul(Q, "q4_0", X.astype(np.float64)), TypeError, "x must have dtype float32"),
    (lambda: K.matmul(Q, "q9_9", X), ValueError, "unknown weight format"),
    (lambda: K.matmul(Q, "q4_0", np.ones((2, 32), np.float32)), ValueError, "bytes per row"),
    (lambda: K.matmul(Q[:, :-1], "q4_0", X), ValueError, "C-contiguous"),
    (lambda: K.matmul(Q.astype(np.int8), "q4_0", X), TypeError, "w must have dtype uint8"),
    (lambda: K.matmul(Q, "q4_0", np.ones((2, 128), np.float32)[:, ::2]), ValueError, "C-contiguous"),
    (lambda: K.matmul(Q, "q4_0", np.frombuffer(np.zeros(2 * 64 * 4 + 1, np.uint8).tobytes(), np.float32, 128, 1).reshape(2, 64)),
     ValueError, "not aligned"),
    (lambda: K.matmul(Q, "q4_0", X, out=np.empty((2, 3), np.float32)), ValueError, r"out must have shape \(2, 4\)"),
    (lambda: K.matmul(Q, "q4_0", X, out=X), ValueError, "shape|overlaps"),
    (lambda: K.matmul(Q, "q4_0", np.ones((0, 64), np.float32)), ValueError, "no rows"),
    (lambda: K.matmul_rows(Q, "q4_0", [0, 4], X), ValueError, r"contains 4, outside \[0, 4\)"),
    (lambda: K.matmul_rows(Q, "q4_0", [0.5], X), TypeError, "integer array"),
    (lambda: K.pack_panels(K.quantize(np.ones((4, 64), np.float32), "f16"), "f16"), ValueError,
     "no panel layout"),
    (lambda: K.matmul_panels(K.pack_panels(Q, "q4_0")[:-1], "q4_0", 4, 64, X), ValueError, "in panels take"),
    (lambda: K.matmul_panels(K.pack_panels(Q, "q4_0"), "q4_0", 4, 64, np.ones((2, 32), np.float32)), ValueError,
     "columns"),
    (lambda: K.dequantize(Q, "q4_0", 48), ValueError, "multiple of 32"),
    (lambda: K.quantize(np.ones((2, 48), np.float32), "q4_0"), ValueError, "multiple of 32"),
    (lambda: K.quantize(np.ones((2, 256), np.float32), "q4_k"), ValueError, "GGUF"),
    (lambda: K.quantize(np.full((1, 32), np.nan, np.float32), "q8_0"), ValueError, "NaN"),
    (lambda: K.row_bytes("q4_k", 640), ValueError, "multiple of 256"),
    (lambda: K.use_isa("sse9"), ValueError, "not available"),
    (lambda: K.set_num_threads(0), ValueError, "between 1 and 1024"),
    (lambda: K.topk(X[0], 65), ValueError, "at most the row length"),
    (lambda: K.rms_norm(X, np.ones(63, np.float32), 1e-6), ValueError, r"weight must have shape \(64,\)"),
    (lambda: K.rope(np.ones((1, 2, 64), np.float32), [0], rot_dim=65, theta_base=1e4), ValueError, "even"),
    (lambda: K.gated_act(X, X[:1], "silu"), ValueError, "same non-empty shape"),
    (lambda: K.gated_act(X, X, "relu"), ValueError, "silu, gelu_tanh"),
])
def test_bad_calls_raise(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def _arena():
    g = np.ones((3, 64), np.float32)
    return K.pack_bundles(g, g, np.ones((64, 3), np.float32), "q8_0", "q8_0", "q8_0")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(slots=[3]), ValueError, r"slots contains 3, outside \[0, 3\)"),
    (dict(slots=[-1]), ValueError, "outside"),
    (dict(x=np.ones((1, 32), np.float32)), ValueError, r"x must have shape \[n_tok >= 1, 64\]"),
    (dict(arena=_arena()[:, :-2].copy()), ValueError, "bundle of d_model 64 takes"),
    (dict(thresholds=np.ones(2, np.float32)), ValueError, r"thresholds must have shape \(1,\)"),
    (dict(act="relu"), ValueError, "act must be one of"),
    (dict(accumulate=True), ValueError, "needs an out buffer"),
])
def test_bad_ffn_calls_raise(kwargs, exc, match):
    args = dict(arena=_arena(), x=np.ones((1, 64), np.float32), slots=[0, 2], d_model=64, gate_fmt="q8_0",
                up_fmt="q8_0", down_fmt="q8_0")
    args.update(kwargs)
    arena, x, slots = args.pop("arena"), args.pop("x"), args.pop("slots")
    with pytest.raises(exc, match=match):
        K.ffn_sparse(arena, x, slots, **args)


def test_bad_attention_calls_raise():
    k, v, sp = K.new_kv_cache(2, 8, 64, "f16")
    q = np.ones((1, 4, 64), np.float32)
    ok = dict(scale=0.125)
    with pytest.raises(ValueError, match="not a multiple of the cache's 2 KV heads"):
        K.attention(np.ones((1, 3, 64), np.float32), k, v, sp, [0], **ok)
    with pytest.raises(ValueError, match=r"mask must have shape \(1, 8\)"):
        K.attention(q, k, v, sp, [0], mask=np.ones((1, 7), bool), **ok)
    with pytest.raises(TypeError, match="float16 \\(f16 cache\\) or uint8"):
        K.attention(q, k.astype(np.float32), v, sp, [0], **ok)
    with pytest.raises(ValueError, match="slot_pos must have shape"):
        K.attention(q, k, v, sp[:7].copy(), [0], **ok)
    with pytest.raises(ValueError, match="head_dim"):
        K.attention(np.ones((1, 4, 32), np.float32), k, v, sp, [0], **ok)
    with pytest.raises(ValueError, match=r"slots contains 8, outside \[0, 8\)"):
        K.kv_write(k, v, sp, np.ones((1, 2, 64), np.float32), np.ones((1, 2, 64), np.float32), [8], [0])
    with pytest.raises(ValueError, match="non-negative"):
        K.kv_write(k, v, sp, np.ones((1, 2, 64), np.float32), np.ones((1, 2, 64), np.float32), [0], [-3])


def test_native_layer_rejects_short_buffers_too():
    """The C++ checks hold even when the Python checks are bypassed."""
    from edgeflash.kernels import _native

    with pytest.raises(ValueError, match="weight buffer holds"):
        _native.matmul(Q[:3].copy(), "q4_0", 4, 64, 0, X, 2, np.empty((2, 4), np.float32), False)
    with pytest.raises(ValueError, match="need"):
        _native.matmul(Q, "q4_0", 4, 64, 0, X[:1].copy(), 2, np.empty((2, 4), np.float32), False)
    with pytest.raises(ValueError, match="outside the arena"):
        _native.ffn_sparse(_arena(), 3, 64, "q8_0", "q8_0", "q8_0", 0, np.ones((1, 64), np.float32), 1,
                           np.array([5], np.int32), "silu", None, np.empty((1, 64), np.float32), False)
