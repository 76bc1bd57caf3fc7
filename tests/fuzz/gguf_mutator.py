"""Structure-aware, seeded mutations of a GGUF file.

Each mutation edits one part of the file the way a corrupted download, a broken converter or an
attacker would (a metadata field's type or value, a tensor's name, shape, type or offset, the
counts, the data bytes, the file itself) and says what a correct loader must do with it:

- REJECT: the file is invalid; the run must end with a clean error (exit 2, one line).
- SAME: the file still describes the same model (or the run must refuse it): a run that succeeds
  must print exactly what the unmutated model prints.
- CLEAN: the file is a valid model with other values (other weights, another RoPE base...):
  any clean outcome, error or output.

`mutate(image, seed)` is deterministic: the same image and seed give the same mutation.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

from edgeflash.kernels.formats import FORMAT_BY_GGML_TYPE, FORMATS
from gguf_image import (
    ARRAY,
    BOOL,
    FLOAT32,
    FLOAT64,
    FLOAT_TYPES,
    INT32,
    INT64,
    INT_TYPES,
    KV,
    SCALAR_CODES,
    STRING,
    UINT8,
    UINT32,
    UINT64,
    GGUFImage,
    TensorEntry,
    encode_string,
    encode_value,
)

REJECT, SAME, CLEAN = "reject", "same", "clean"
# Nested metadata arrays a reader must accept (GGUF allows nesting); deeper ones it must refuse.
MAX_ACCEPTED_NESTING = 8
# Untrusted text a file may carry: terminal escapes (colour, window title, cursor moves), a
# carriage return that overwrites the line, bidirectional overrides, a NUL.
HOSTILE_TEXTS = ["\x1b[31mred\x1b[0m", "\x1b]0;owned\x07", "line\rover", "a\x00b", "\u202eevil", "\x1b[2J\x1b[H",
                 "\x9b31m", "tab\there\nnew line"]
SPECIAL_FILES = ("fifo", "dev_zero", "dev_urandom", "dev_null", "directory", "symlink_loop", "dangling_symlink",
                 "empty", "symlink_to_model", "sparse_tail")


@dataclass
class Mutation:
    op: str  # the operator's name
    detail: str  # what it changed, for the report
    expect: str  # REJECT, SAME or CLEAN
    image: GGUFImage | None = None  # the mutated file, or None for a special file
    special: str | None = None  # one of SPECIAL_FILES
    touches_data: bool = False  # the tensor bytes (or which bytes a tensor names) changed


class Model:
    """What the operators need to know about the unmutated file."""

    def __init__(self, image: GGUFImage):
        self.image = image
        self.arch = image.architecture
        self.prefix = self.arch + "."
        tokens = image.kv("tokenizer.ggml.tokens")
        self.n_tokens = tokens.array_header()[1] if tokens is not None else 0
        self.shape_keys = [k for k in ("block_count", "embedding_length", "feed_forward_length",
                                       "attention.head_count", "attention.head_count_kv", "attention.key_length",
                                       "attention.value_length", "vocab_size") if image.kv(self.prefix + k)]
        self.int_keys = self.shape_keys + [k for k in ("context_length", "attention.sliding_window",
                                                       "rope.dimension_count") if image.kv(self.prefix + k)]
        self.float_keys = [k for k in ("attention.layer_norm_rms_epsilon", "rope.freq_base")
                           if image.kv(self.prefix + k)]
        self.token_id_keys = [k for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id")
                              if image.kv(k)]
        self.bool_keys = [k for k in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                      "tokenizer.ggml.add_space_prefix") if image.kv(k)]
        # Keys no loader reads: any valid value of any type is fine there.
        self.unused_keys = [kv.key.decode() for kv in image.kvs
                            if kv.key.decode() in ("general.type", "general.license", "general.size_label",
                                                   "general.basename", "general.quantization_version",
                                                   "general.file_type", "general.finetune", "general.organization")]
        self.required_keys = ["general.architecture", self.prefix + "block_count", self.prefix + "embedding_length",
                              self.prefix + "feed_forward_length", self.prefix + "attention.head_count",
                              "tokenizer.ggml.model", "tokenizer.ggml.tokens"]
        if self.arch != "gemma3":
            self.required_keys.append(self.prefix + "attention.layer_norm_rms_epsilon")
        head_dim_kv = image.kv(self.prefix + "attention.key_length")
        self.head_dim = (head_dim_kv.value() if head_dim_kv else
                         image.kv(self.prefix + "embedding_length").value()
                         // image.kv(self.prefix + "attention.head_count").value())
        self.by_offset = sorted(range(len(image.tensors)), key=lambda i: image.tensors[i].offset)


# -- helpers ----------------------------------------------------------------------------------------


def _set_kv(image: GGUFImage, key: str, kv: KV) -> GGUFImage:
    out = image.clone()
    index = out.kv_index(key)
    if index is None:
        out.kvs.append(kv)
    else:
        out.kvs[index] = kv
    return out


def _int_candidates(value: int, rng: random.Random) -> int:
    return rng.choice([0, 1, -1, value - 1, value + 1, value * 2, value // 2, 3, 2**31 - 1, 2**32 - 1, 2**31,
                       2**63 - 1, 2**64 - 1, 2**40, value * 1000])


def _fits(vtype: int, value: int) -> bool:
    bits = struct.calcsize("<" + SCALAR_CODES[vtype]) * 8
    signed = vtype in (INT32, INT64) or SCALAR_CODES[vtype].islower()
    return (-(2 ** (bits - 1)) <= value < 2 ** (bits - 1)) if signed else 0 <= value < 2**bits


def _wrap(vtype: int, value: int) -> int:
    """`value` as the field's integer type stores it (two's complement for negatives)."""
    bits = struct.calcsize("<" + SCALAR_CODES[vtype]) * 8
    value %= 2**bits
    signed = SCALAR_CODES[vtype].islower()
    return value - 2**bits if signed and value >= 2 ** (bits - 1) else value


def _printable(raw: bytes | str, limit: int = 40) -> str:
    return repr(raw[:limit])


# -- header operators -------------------------------------------------------------------------------


def op_magic(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    out.magic = rng.choice([b"GGUE", b"FUGG", b"\x00\x00\x00\x00", b"GGML", b"\x1b[2J"])
    return Mutation("magic", f"magic {out.magic!r}", REJECT, out)


def op_version(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    out.version = rng.choice([0, 1, 2, 4, 2**31, 2**32 - 1])
    return Mutation("version", f"version {out.version}", SAME if out.version == 2 else REJECT, out)


def op_tensor_count(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    n = len(out.tensors)
    out.n_tensors = rng.choice([0, n - 1, n + 1, n * 2, 2**32, 2**63, 2**64 - 1])
    return Mutation("tensor_count", f"tensor count {out.n_tensors} (has {n})", REJECT, out)


def op_kv_count(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    n = len(out.kvs)
    out.n_kv = rng.choice([0, n - 1, n + 1, 2**32, 2**63, 2**64 - 1])
    return Mutation("kv_count", f"metadata count {out.n_kv} (has {n})", REJECT, out)


def op_truncate(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    header = len(out.header())
    total = -(-header // out.alignment) * out.alignment + out.data_size
    where = rng.choice(["header", "tensor_infos", "data", "last_byte"])
    if where == "header":
        out.truncate = rng.randrange(0, 64)
    elif where == "tensor_infos":
        out.truncate = rng.randrange(header - 200 * len(out.tensors) // 2, header)
    elif where == "data":
        out.truncate = rng.randrange(header + 1, total)
    else:
        out.truncate = total - 1
    return Mutation("truncate", f"cut to {out.truncate} bytes ({where})", REJECT, out, touches_data=True)


def op_append(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    out.append = bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 31, 32, 4096])))
    return Mutation("append", f"{len(out.append)} bytes appended", REJECT, out)


def op_shift_data(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    out.header_padding = rng.choice([m.image.alignment, 2 * m.image.alignment, 4096])
    return Mutation("shift_data", f"data section moved {out.header_padding} bytes later", REJECT, out,
                    touches_data=True)


# -- metadata operators -----------------------------------------------------------------------------


def op_int_value(m: Model, rng: random.Random) -> Mutation:
    key = m.prefix + rng.choice(m.int_keys)
    kv = m.image.kv(key)
    old = kv.value()
    new = _int_candidates(old, rng)
    if new == old:
        new = old + 1
    if not _fits(kv.vtype, new):
        new = _wrap(kv.vtype, new)
    short = key[len(m.prefix):]
    if new == old:
        expect = SAME
    elif short in ("context_length",):
        expect = REJECT if new <= 0 else CLEAN
    elif short == "attention.sliding_window":
        expect = REJECT if new < 0 else CLEAN
    elif short == "rope.dimension_count":
        expect = CLEAN if new == 0 or (new > 0 and new % 2 == 0 and new <= m.head_dim) else REJECT
    else:  # a shape the tensors must agree with
        expect = REJECT
    return Mutation("int_value", f"{key} {old} -> {new}", expect, _set_kv(m.image, key, KV(kv.key, kv.vtype,
                    encode_value(kv.vtype, new))))


def op_float_value(m: Model, rng: random.Random) -> Mutation:
    key = m.prefix + rng.choice(m.float_keys)
    kv = m.image.kv(key)
    old = kv.value()
    new = rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e-45, 1e30, 3.4e38, old * 2, old / 2, 1.0])
    is_eps = key.endswith("epsilon")
    valid = math.isfinite(new) and new > 0 and (new < 1 if is_eps else True)
    if kv.vtype == FLOAT32 and valid:
        valid = struct.unpack("<f", struct.pack("<f", new))[0] > 0  # 1e-45 survives as the smallest denormal
    return Mutation("float_value", f"{key} {old} -> {new}", CLEAN if valid else REJECT,
                    _set_kv(m.image, key, KV(kv.key, kv.vtype, encode_value(kv.vtype, new))))


def op_retype(m: Model, rng: random.Random) -> Mutation:
    """A field stored with another type: a float block_count, a string alignment, a bool head count."""
    pools = [("int", m.prefix + k) for k in m.int_keys] + [("float", m.prefix + k) for k in m.float_keys]
    pools += [("token_id", k) for k in m.token_id_keys] + [("bool", k) for k in m.bool_keys]
    pools += [("string", "general.architecture"), ("string", "tokenizer.ggml.model")]
    kind, key = rng.choice(pools)
    kv = m.image.kv(key)
    old = kv.value()
    target = rng.choice([UINT8, INT32, UINT64, INT64, FLOAT32, FLOAT64, BOOL, STRING, ARRAY])
    if target == kv.vtype:
        target = STRING if kv.vtype != STRING else UINT32
    if target == STRING:
        value, payload = str(old), encode_string(str(old))
    elif target == ARRAY:
        value, payload = [old], encode_value(ARRAY, (kv.vtype, [old]))
    elif target == BOOL:
        value, payload = bool(old), encode_value(BOOL, bool(old))
    elif target in FLOAT_TYPES:
        value = float(old) if not isinstance(old, str) else 0.0
        payload = encode_value(target, value)
    else:
        value = int(old) if isinstance(old, (int, float)) and not isinstance(old, bool) else 0
        value = _wrap(target, value)
        payload = encode_value(target, value)
    expect = REJECT
    if kind in ("int", "token_id") and target in INT_TYPES and value == old:
        expect = SAME  # the same number in another integer type
    if kind == "float" and target in INT_TYPES + FLOAT_TYPES:
        # A float field written as an integer or a double is still the number it was.
        ok = value > 0 and math.isfinite(value) and (value < 1 if key.endswith("epsilon") else True)
        expect = (SAME if value == old or (target == FLOAT64 and value == float(old)) else CLEAN) if ok else REJECT
    return Mutation("retype", f"{key} type {kv.vtype} -> {target} ({value!r:.30})", expect,
                    _set_kv(m.image, key, KV(kv.key, target, payload)))


def op_token_id(m: Model, rng: random.Random) -> Mutation:
    key = rng.choice(m.token_id_keys)
    kv = m.image.kv(key)
    new = rng.choice([m.n_tokens, m.n_tokens + 1, 2**32 - 1, 0, 5, m.n_tokens - 1])
    if not _fits(kv.vtype, new):
        new = _wrap(kv.vtype, new)
    expect = CLEAN if 0 <= new < m.n_tokens else REJECT
    return Mutation("token_id", f"{key} -> {new}", expect,
                    _set_kv(m.image, key, KV(kv.key, kv.vtype, encode_value(kv.vtype, new))))


def op_string_value(m: Model, rng: random.Random) -> Mutation:
    key = rng.choice(["general.architecture", "tokenizer.ggml.model", "general.name", "tokenizer.ggml.pre",
                      "tokenizer.chat_template"])
    kv = m.image.kv(key)
    choice = rng.choice(["hostile", "invalid_utf8", "empty", "other_arch", "huge_length", "long"])
    if choice == "hostile":
        raw = rng.choice(HOSTILE_TEXTS).encode()
    elif choice == "invalid_utf8":
        raw = b"\xff\xfe\xc3(" + b"abc"
    elif choice == "empty":
        raw = b""
    elif choice == "other_arch":
        raw = rng.choice([b"llama", b"gemma3", b"qwen2", b"mistral", b"bert", b"gpt2"])
    elif choice == "long":
        raw = b"x" * 100_000
    else:
        raw = None
    if raw is None:  # a length far past the end of the file
        payload = struct.pack("<Q", rng.choice([2**40, 2**63, 2**64 - 1, m.image.data_size * 2])) + b"abc"
        return Mutation("string_value", f"{key} length past the end", REJECT, _set_kv(m.image, key, KV(kv.key if kv
                        else key.encode(), STRING, payload)))
    old = kv.value() if kv else None
    if choice == "invalid_utf8":
        expect = REJECT
    elif key == "general.architecture" or key == "tokenizer.ggml.model":
        expect = SAME if raw.decode() == old else REJECT
    else:
        expect = CLEAN  # a name, a pre-tokenizer name or a chat template: any text is valid
    return Mutation("string_value", f"{key} = {_printable(raw)}", expect,
                    _set_kv(m.image, key, KV(key.encode(), STRING, encode_string(raw))))


def op_remove_kv(m: Model, rng: random.Random) -> Mutation:
    key = rng.choice(m.required_keys + [m.prefix + k for k in m.int_keys + m.float_keys] + m.unused_keys
                     + m.token_id_keys)
    out = m.image.clone()
    old = m.image.kv(key).value()
    del out.kvs[out.kv_index(key)]
    short = key.removeprefix(m.prefix)
    # What a missing optional key defaults to, where that is the value the file had.
    defaults = {"attention.head_count_kv": m.image.kv(m.prefix + "attention.head_count").value(),
                "attention.key_length": 256 if m.arch == "gemma3" else None,
                "vocab_size": m.n_tokens, "attention.value_length": old}
    if key in m.required_keys:
        expect = REJECT
    elif key in m.unused_keys:
        expect = SAME
    elif short in defaults:
        expect = SAME if defaults[short] == old else REJECT
    else:  # context length, window, RoPE, epsilon with a default, token ids: another valid model
        expect = CLEAN
    return Mutation("remove_kv", f"{key} removed", expect, out)


def op_duplicate_kv(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    index = rng.randrange(len(out.kvs))
    kv = out.kvs[index]
    out.kvs.insert(rng.randrange(len(out.kvs) + 1), kv)
    return Mutation("duplicate_kv", f"{kv.key.decode(errors='replace')} twice", REJECT, out)


def op_rename_kv(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    use_required = rng.random() < 0.5
    key = rng.choice(m.required_keys if use_required else m.unused_keys)
    index = out.kv_index(key)
    raw = rng.choice([t.encode() for t in HOSTILE_TEXTS] + [b"\xff\xfe", b"", b"k" * 70000])
    out.kvs[index] = KV(raw, out.kvs[index].vtype, out.kvs[index].payload)
    invalid = b"\xff" in raw
    expect = REJECT if use_required or invalid else CLEAN
    if not use_required and not invalid and any(kv.key == raw for i, kv in enumerate(out.kvs) if i != index):
        expect = REJECT
    return Mutation("rename_kv", f"{key} renamed {_printable(raw)}", expect, out)


def op_nested_array(m: Model, rng: random.Random) -> Mutation:
    depth = rng.choice([2, 3, MAX_ACCEPTED_NESTING, MAX_ACCEPTED_NESTING + 1, 64, 1000, 50_000, 100_000])
    payload = struct.pack("<IQ", UINT8, 3) + b"\x01\x02\x03"
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", ARRAY, 1) + payload
    key = rng.choice(m.unused_keys + ["fuzz.nested"])
    expect = CLEAN if depth <= MAX_ACCEPTED_NESTING else REJECT
    return Mutation("nested_array", f"{key} nested {depth} deep", expect, _set_kv(m.image, key, KV(key.encode(),
                    ARRAY, payload)))


def op_array_count(m: Model, rng: random.Random) -> Mutation:
    arrays = [kv for kv in m.image.kvs if kv.vtype == ARRAY]
    kv = rng.choice(arrays)
    etype, count = kv.array_header()
    new = rng.choice([count + 1, count - 1, count * 2, 2**32, 2**62, 2**64 - 1, 0])
    if new == count:
        new = count + 1
    payload = struct.pack("<IQ", etype, new) + kv.payload[12:]
    key = kv.key.decode()
    # An empty array of an optional tokenizer field, or a shorter list at the very end of the
    # metadata, could parse; every other count makes the following bytes misparse.
    expect = REJECT
    if new == 0 and key in ("general.languages", "general.tags"):
        expect = REJECT  # the dropped elements' bytes are then read as the next key
    return Mutation("array_count", f"{key} count {count} -> {new}", expect,
                    _set_kv(m.image, key, KV(kv.key, kv.vtype, payload)))


def op_array_type(m: Model, rng: random.Random) -> Mutation:
    arrays = [kv for kv in m.image.kvs if kv.vtype == ARRAY and kv.key.startswith(b"tokenizer.")]
    kv = rng.choice(arrays)
    etype, count = kv.array_header()
    new = rng.choice([t for t in (UINT8, UINT32, INT32, FLOAT32, STRING, BOOL, ARRAY, 13, 2**32 - 1) if t != etype])
    payload = struct.pack("<IQ", new, count) + kv.payload[12:]
    # token_type's small non-negative ints read the same as another 32-bit integer type.
    same = etype in (INT32, UINT32) and new in (INT32, UINT32)
    return Mutation("array_type", f"{kv.key.decode()} element type {etype} -> {new}", SAME if same else REJECT,
                    _set_kv(m.image, kv.key.decode(), KV(kv.key, kv.vtype, payload)))


def op_token_types(m: Model, rng: random.Random) -> Mutation:
    kv = m.image.kv("tokenizer.ggml.token_type")
    etype, count = kv.array_header()
    width = struct.calcsize("<" + SCALAR_CODES[etype])
    body = bytearray(kv.payload[12:])
    bad = rng.random() < 0.5
    for _ in range(rng.choice([1, 10, 1000])):
        i = rng.randrange(count)
        value = rng.choice([7, 99, -1, 2**31 - 1]) if bad else rng.choice([1, 3, 4, 6])
        body[i * width:(i + 1) * width] = struct.pack("<" + SCALAR_CODES[etype], _wrap(etype, value))
    return Mutation("token_types", f"token types {'out of range' if bad else 'changed'}", REJECT if bad else CLEAN,
                    _set_kv(m.image, "tokenizer.ggml.token_type", KV(kv.key, kv.vtype, kv.payload[:12] + bytes(body))))


def op_scores(m: Model, rng: random.Random) -> Mutation | None:
    kv = m.image.kv("tokenizer.ggml.scores")
    if kv is None:
        return None
    _, count = kv.array_header()
    body = bytearray(kv.payload[12:])
    value = rng.choice([math.nan, math.inf, -math.inf, 1e30, 0.0])
    for _ in range(rng.choice([1, 100])):
        i = rng.randrange(count)
        body[i * 4:(i + 1) * 4] = struct.pack("<f", value)
    return Mutation("scores", f"scores set to {value}", CLEAN if math.isfinite(value) else REJECT,
                    _set_kv(m.image, "tokenizer.ggml.scores", KV(kv.key, kv.vtype, kv.payload[:12] + bytes(body))))


# -- tensor table operators -------------------------------------------------------------------------


def _tensor(m: Model, rng: random.Random) -> tuple[int, TensorEntry]:
    index = rng.randrange(len(m.image.tensors))
    return index, m.image.tensors[index]


def _with_tensor(m: Model, index: int, entry: TensorEntry) -> GGUFImage:
    out = m.image.clone()
    out.tensors[index] = entry
    return out


def op_tensor_name(m: Model, rng: random.Random) -> Mutation:
    index, t = _tensor(m, rng)
    other = m.image.tensors[rng.randrange(len(m.image.tensors))].name
    layer_count = m.image.kv(m.prefix + "block_count").value()
    raw = rng.choice([other, t.name.replace(b"weight", b"wieght"), t.name + rng.choice(HOSTILE_TEXTS).encode(),
                      b"\xff\xfe" + t.name, b"", b"n" * 5000, f"blk.{layer_count + 3}.attn_q.weight".encode(),
                      b"blk.-1.attn_q.weight", b"blk.1e3.ffn_up.weight"])
    if raw == t.name:
        raw = t.name + b".x"
    return Mutation("tensor_name", f"{t.name.decode()} renamed {_printable(raw)}", REJECT,
                    _with_tensor(m, index, TensorEntry(raw, t.dims, t.ggml_type, t.offset)), touches_data=True)


def op_tensor_dims(m: Model, rng: random.Random) -> Mutation:
    index, t = _tensor(m, rng)
    dims = list(t.dims)
    choice = rng.choice(["zero", "huge", "swap", "plus_block", "extra_one", "drop", "overflow", "n_dims"])
    n_dims = None
    expect = REJECT
    if choice == "zero":
        dims[rng.randrange(len(dims))] = 0
    elif choice == "huge":
        dims[rng.randrange(len(dims))] = rng.choice([2**32, 2**40, 2**63 - 1, 2**64 - 1])
    elif choice == "swap" and len(dims) == 2 and dims[0] != dims[1]:
        dims = [dims[1], dims[0]]
    elif choice == "plus_block":
        dims[-1] += 1
    elif choice == "extra_one":
        dims.append(1)  # ggml's trailing dimension of 1: the same tensor
        expect = SAME
    elif choice == "drop" and len(dims) > 1:
        dims = dims[:-1]
    elif choice == "overflow":
        dims = [2**32, 2**32] + dims[2:]
    else:
        n_dims = rng.choice([0, 5, 2**32 - 1])
        choice = "n_dims"
    if dims == t.dims and n_dims is None:
        dims = [d * 2 for d in dims]
    return Mutation("tensor_dims", f"{t.name.decode()} dims {t.dims} -> {dims if n_dims is None else n_dims} "
                    f"({choice})", expect, _with_tensor(m, index, TensorEntry(t.name, dims, t.ggml_type, t.offset,
                                                                               n_dims)), touches_data=True)


def op_tensor_type(m: Model, rng: random.Random) -> Mutation:
    index, t = _tensor(m, rng)
    old = FORMAT_BY_GGML_TYPE[t.ggml_type]
    choice = rng.choice(["known", "known", "float", "unknown"])
    if choice == "float" and old.name in ("f32", "f16", "bf16"):
        new = FORMATS[rng.choice([f for f in ("f32", "f16", "bf16") if f != old.name])].ggml_type
    elif choice == "unknown":
        new = rng.choice([4, 5, 39, 1000, 2**32 - 1])
    else:
        new = rng.choice([f.ggml_type for f in FORMAT_BY_GGML_TYPE.values() if f.ggml_type != t.ggml_type])
    fmt = FORMAT_BY_GGML_TYPE.get(new)
    # Types with the same bytes per element (f16 and bf16; q4_0 and q4_K, q5_0 and q5_K over rows
    # of 256) describe a file of the same layout: other values, no structural fault.
    relabelled = TensorEntry(t.name, t.dims, new, t.offset)
    try:
        same_size = fmt is not None and relabelled.nbytes == t.nbytes
    except ValueError:  # rows that are not whole blocks of the new type
        same_size = False
    expect = CLEAN if same_size else REJECT
    return Mutation("tensor_type", f"{t.name.decode()} type {old.name} -> {fmt.name if fmt else new}", expect,
                    _with_tensor(m, index, relabelled), touches_data=True)


def op_tensor_offset(m: Model, rng: random.Random) -> Mutation:
    index, t = _tensor(m, rng)
    align = m.image.alignment
    other = m.image.tensors[rng.randrange(len(m.image.tensors))]
    choice = rng.choice(["plus_one", "plus_align", "minus_align", "alias", "past_end", "huge", "zero"])
    new = {"plus_one": t.offset + 1, "plus_align": t.offset + align, "minus_align": t.offset - align,
           "alias": other.offset, "past_end": m.image.data_size + align, "huge": 2**64 - align,
           "zero": 0}[choice]
    if new == t.offset:
        new = t.offset + 3
    return Mutation("tensor_offset", f"{t.name.decode()} offset {t.offset} -> {new} ({choice})", REJECT,
                    _with_tensor(m, index, TensorEntry(t.name, t.dims, t.ggml_type, new)), touches_data=True)


def op_swap_offsets(m: Model, rng: random.Random) -> Mutation:
    a, b = rng.sample(range(len(m.image.tensors)), 2)
    ta, tb = m.image.tensors[a], m.image.tensors[b]
    out = m.image.clone()
    out.tensors[a] = TensorEntry(ta.name, ta.dims, ta.ggml_type, tb.offset)
    out.tensors[b] = TensorEntry(tb.name, tb.dims, tb.ggml_type, ta.offset)
    # Two tensors of the same size trading places still tile the file: a valid file whose
    # tensors hold each other's bytes (GGUF has no checksum to tell).
    expect = CLEAN if ta.nbytes == tb.nbytes else REJECT
    return Mutation("swap_offsets", f"{ta.name.decode()} <-> {tb.name.decode()}", expect, out, touches_data=True)


def op_drop_tensor(m: Model, rng: random.Random) -> Mutation:
    index, t = _tensor(m, rng)
    out = m.image.clone()
    del out.tensors[index]
    return Mutation("drop_tensor", f"{t.name.decode()} left out of the table", REJECT, out, touches_data=True)


def op_duplicate_tensor(m: Model, rng: random.Random) -> Mutation:
    _, t = _tensor(m, rng)
    out = m.image.clone()
    out.tensors.insert(rng.randrange(len(out.tensors) + 1), t)
    return Mutation("duplicate_tensor", f"{t.name.decode()} listed twice", REJECT, out, touches_data=True)


def op_shuffle_tensors(m: Model, rng: random.Random) -> Mutation:
    out = m.image.clone()
    rng.shuffle(out.tensors)
    return Mutation("shuffle_tensors", "tensor table in another order", SAME, out)


def op_alignment(m: Model, rng: random.Random) -> Mutation:
    value = rng.choice([0, 1, 3, 7, 8, 16, 24, 64, 4096, 2**31, 2**32 - 1, "32", 32.0])
    if isinstance(value, str):
        kv = KV.make("general.alignment", STRING, value)
    elif isinstance(value, float):
        kv = KV.make("general.alignment", FLOAT32, value)
    else:
        kv = KV.make("general.alignment", UINT32, value)
    power_of_two = isinstance(value, int) and value >= 8 and value & (value - 1) == 0
    # The data section stays where the file's own 32-byte alignment put it: a reader that
    # believes another alignment looks elsewhere unless the two happen to agree.
    expect = SAME if power_of_two else REJECT
    return Mutation("alignment", f"general.alignment = {value!r}", expect, _set_kv(m.image, "general.alignment", kv),
                    touches_data=True)


# -- tensor data operators (valid files with other values) -----------------------------------------


def _data_patch(m: Model, rng: random.Random, names: Callable[[TensorEntry], bool]) -> tuple[TensorEntry, int]:
    candidates = [t for t in m.image.tensors if names(t)]
    t = rng.choice(candidates)
    return t, t.offset


def op_nan_vector(m: Model, rng: random.Random) -> Mutation:
    t, at = _data_patch(m, rng, lambda t: len(t.dims) == 1 and FORMAT_BY_GGML_TYPE[t.ggml_type].name == "f32")
    value = rng.choice([math.nan, math.inf, -math.inf, 3.0e38, 0.0])
    out = m.image.clone()
    for _ in range(rng.choice([1, 8, t.dims[0]])):
        out.patches.append((at + 4 * rng.randrange(t.dims[0]), struct.pack("<f", value)))
    return Mutation("nan_vector", f"{t.name.decode()} values {value}", CLEAN, out, touches_data=True)


def op_nan_scale(m: Model, rng: random.Random) -> Mutation:
    """A quantized block's fp16 scale (the first two bytes of every block of these formats)."""
    t, at = _data_patch(m, rng, lambda t: FORMAT_BY_GGML_TYPE[t.ggml_type].name in ("q8_0", "q4_0", "q4_1", "q5_0",
                                                                                    "q4_k", "q6_k"))
    fmt = FORMAT_BY_GGML_TYPE[t.ggml_type]
    scale_at = fmt.block_bytes - 2 if fmt.name == "q6_k" else 0  # q6_K keeps its scale last
    value = rng.choice([0x7E00, 0x7C00, 0xFC00, 0x7BFF, 0x0000])  # NaN, +inf, -inf, 65504, 0
    blocks = t.nbytes // fmt.block_bytes
    out = m.image.clone()
    for _ in range(rng.choice([1, 16, 1024])):
        out.patches.append((at + rng.randrange(blocks) * fmt.block_bytes + scale_at, struct.pack("<H", value)))
    return Mutation("nan_scale", f"{t.name.decode()} block scales {value:#06x}", CLEAN, out, touches_data=True)


def op_flip_bytes(m: Model, rng: random.Random) -> Mutation:
    t = rng.choice(m.image.tensors)
    out = m.image.clone()
    for _ in range(rng.choice([1, 64, 4096])):
        out.patches.append((t.offset + rng.randrange(t.nbytes), bytes([rng.randrange(256)])))
    return Mutation("flip_bytes", f"{t.name.decode()} bytes changed", CLEAN, out, touches_data=True)


def op_zero_tensor(m: Model, rng: random.Random) -> Mutation:
    t = rng.choice([t for t in m.image.tensors if t.nbytes <= 8 << 20])
    out = m.image.clone()
    out.patches.append((t.offset, bytes(t.nbytes)))
    return Mutation("zero_tensor", f"{t.name.decode()} all zero", CLEAN, out, touches_data=True)


# -- the file itself --------------------------------------------------------------------------------


def op_special_file(m: Model, rng: random.Random) -> Mutation:
    kind = rng.choice(SPECIAL_FILES)
    expect = SAME if kind == "symlink_to_model" else REJECT
    return Mutation("special_file", kind, expect, None, special=kind)


OPERATORS: list[tuple[Callable[[Model, random.Random], Mutation | None], int]] = [
    (op_magic, 2), (op_version, 3), (op_tensor_count, 4), (op_kv_count, 4), (op_truncate, 6), (op_append, 2),
    (op_shift_data, 2), (op_int_value, 14), (op_float_value, 8), (op_retype, 12), (op_token_id, 4),
    (op_string_value, 8), (op_remove_kv, 6), (op_duplicate_kv, 3), (op_rename_kv, 4), (op_nested_array, 6),
    (op_array_count, 5), (op_array_type, 3), (op_token_types, 3), (op_scores, 2), (op_tensor_name, 8),
    (op_tensor_dims, 10), (op_tensor_type, 8), (op_tensor_offset, 10), (op_swap_offsets, 4), (op_drop_tensor, 3),
    (op_duplicate_tensor, 3), (op_shuffle_tensors, 2), (op_alignment, 6), (op_nan_vector, 4), (op_nan_scale, 5),
    (op_flip_bytes, 3), (op_zero_tensor, 2), (op_special_file, 8),
]


def mutate(model: Model, seed: int) -> Mutation:
    """One mutation of `model`'s file, the same for the same seed."""
    rng = random.Random(seed)
    ops, weights = zip(*OPERATORS)
    while True:
        op = rng.choices(ops, weights)[0]
        mutation = op(model, rng)
        if mutation is not None:
            return mutation
