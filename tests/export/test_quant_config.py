"""QuantConfig, the scheme registry, roles and fallback planning (no model needed)."""

from __future__ import annotations

import pytest
from edgeflash.base.errors import UserError
from edgeflash.export.quant import QuantConfig, QuantConfigError, Rule, get_scheme, list_schemes, role_of


@pytest.mark.parametrize("name,role", [
    ("token_embd.weight", "embedding"), ("output.weight", "head"), ("output_norm.weight", "norm"),
    ("blk.3.attn_norm.weight", "norm"), ("blk.3.attn_q_norm.weight", "norm"), ("blk.0.post_ffw_norm.weight", "norm"),
    ("blk.0.ffn_norm.weight", "norm"), ("blk.11.attn_q.weight", "attention"), ("blk.2.attn_q.bias", "attention"),
    ("blk.2.attn_output.weight", "attention"), ("blk.7.ffn_down.weight", "ffn"), ("blk.7.ffn_gate.weight", "ffn"),
])
def test_role_of(name, role):
    assert role_of(name) == role


def test_role_of_unknown_tensor():
    with pytest.raises(ValueError, match="no quantization role"):
        role_of("blk.0.mystery.weight")


@pytest.mark.parametrize("scheme", list_schemes())
def test_every_registered_scheme_round_trips_through_json(scheme):
    config = get_scheme(scheme)
    assert QuantConfig.from_json(config.to_json()) == config
    assert QuantConfig.from_dict(config.to_dict()) == config
    for role in ("embedding", "head", "attention", "ffn", "norm"):
        config.rule_for_role(role)  # every role covered


def test_required_schemes_exist():
    assert {"keep", "q8_0", "q4_0", "q4_1", "q4_k", "q4_lut", "q4_0-mixed"} <= set(list_schemes())


def test_mixed_rules_order_and_defaults():
    config = get_scheme("mixed:attention=q8_0,ffn=q4_0/rtn,head=q4_k")
    assert config.rule_for("blk.0.attn_k.weight") == Rule("attention", "q8_0", "rtn")
    assert config.rule_for("blk.0.ffn_up.weight") == Rule("ffn", "q4_0", "rtn")
    assert config.rule_for("output.weight").fallback == "q5_0"
    assert config.rule_for("blk.0.attn_norm.weight").format == "f32"  # norms stay f32
    assert config.rule_for("token_embd.weight").format == "keep"  # unnamed roles keep the source
    assert QuantConfig.from_json(config.to_json()) == config


def test_mixed_star_rule_and_group_size():
    config = get_scheme("mixed:*=q8_0@32,ffn=q4_lut")
    assert config.rule_for("token_embd.weight").format == "q8_0"
    assert config.rule_for("token_embd.weight").group_size == 32
    assert config.rule_for("blk.1.ffn_down.weight") == Rule("ffn", "q4_lut", "weighted")
    assert config.arena_format() == "q4_lut"


@pytest.mark.parametrize("text,fragment", [
    ("q3_zz", "unknown quant scheme 'q3_zz'"),
    ("mixed:", "expected rules"),
    ("mixed:ffn=q9_9", "unknown format 'q9_9'"),
    ("mixed:brain=q4_0", "unknown role 'brain'"),
    ("mixed:ffn", "is not ROLE=FORMAT"),
    ("mixed:ffn=q4_0,ffn=q8_0", "given twice"),
    ("mixed:ffn=q4_0@64", "group size 64 is impossible for q4_0, whose blocks hold 32 values"),
    ("mixed:ffn=q4_lut@32", "group size 32 is impossible for q4_lut, which has one table per row"),
    ("mixed:ffn=q4_0@abc", "not an integer"),
    ("mixed:norm=q4_0", "norms stay f32"),
    ("mixed:ffn=f16/weighted", "needs a quantized format"),
    ("mixed:ffn=keep/rtn", "keep uses copy"),
])
def test_bad_schemes_are_user_errors(text, fragment):
    with pytest.raises(QuantConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")) as info:
        get_scheme(text)
    assert isinstance(info.value, UserError)


def test_group_size_applied_to_a_named_scheme():
    assert get_scheme("q4_0").with_group_size(32).rule_for("token_embd.weight").group_size == 32
    with pytest.raises(QuantConfigError, match="group size 128 is impossible for q4_0"):
        get_scheme("q4_0").with_group_size(128)
    assert get_scheme("q4_k").with_group_size(256).rule_for("blk.0.ffn_up.weight").group_size == 256


def test_fallback_for_rows_a_format_cannot_take():
    config = get_scheme("q4_k")
    plan = config.plan("blk.0.attn_q.weight", (1024, 640))  # Gemma 3: rows of 640 values
    assert (plan.format, plan.fallback_from) == ("q5_0", "q4_k")
    assert "640" in plan.reason and "256" in plan.reason
    assert config.plan("blk.0.attn_output.weight", (640, 1024)).format == "q4_k"
    assert config.plan("blk.0.attn_norm.weight", (640,)).format == "f32"
    q3 = get_scheme("q3_k")  # 256-value blocks too, with q4_0 (the next size up) for other rows
    assert (q3.plan("blk.0.attn_q.weight", (576, 576)).format, q3.plan("blk.0.ffn_down.weight", (576, 1536)).format) \
        == ("q4_0", "q3_k")
    with pytest.raises(QuantConfigError, match="fallback must be a format every row length"):
        Rule("*", "q4_0", "rtn", fallback="q3_k")


def test_rows_no_format_can_take_are_an_error():
    with pytest.raises(QuantConfigError, match="rows of 48 values: q4_0 needs multiples of 32 and rule \\*=q4_0 "
                                               "has no fallback"):
        get_scheme("q4_0").plan("blk.0.attn_q.weight", (64, 48))


def test_keep_copies_everything():
    config = get_scheme("keep")
    for name, shape in [("token_embd.weight", (10, 64)), ("blk.0.attn_norm.weight", (64,))]:
        plan = config.plan(name, shape)
        assert (plan.format, plan.method) == ("keep", "copy")
    assert not config.calibrated and config.rtn_baseline() is None
    assert config.arena_format() == "q8_0"


def test_rtn_baseline_of_calibrated_schemes():
    base = get_scheme("q4_lut").rtn_baseline()
    assert base.rule_for("blk.0.ffn_up.weight") == Rule("*", "q4_0", "rtn")
    assert base.rule_for("output_norm.weight").format == "f32"
    mixed = get_scheme("q4_0-mixed").rtn_baseline()
    assert mixed.rule_for("blk.0.ffn_up.weight").method == "rtn"
    assert mixed.rule_for("blk.0.attn_q.weight") == Rule("attention", "q8_0", "rtn")


def test_from_dict_rejects_bad_input():
    with pytest.raises(QuantConfigError, match="needs 'scheme'"):
        QuantConfig.from_dict({"rules": []})
    with pytest.raises(QuantConfigError, match="rules\\[0\\] needs 'role' and 'format'"):
        QuantConfig.from_dict({"scheme": "x", "rules": [{"format": "q4_0"}]})
    with pytest.raises(QuantConfigError, match="not valid JSON"):
        QuantConfig.from_json("{nope")
    with pytest.raises(QuantConfigError, match="newer"):
        QuantConfig.from_dict({**get_scheme("q8_0").to_dict(), "version": 99})


@pytest.mark.parametrize("name,scheme", [("Q3_K_M", "q3_k"), ("q3_k_s", "q3_k"), ("Q4_K_M", "q4_k"), ("Q8_0", "q8_0")])
def test_llama_cpp_names_that_map(name, scheme):
    assert get_scheme(name).to_dict() == get_scheme(scheme).to_dict()


@pytest.mark.parametrize("name", ["Q3_K_L", "Q5_K_M", "IQ4_XS"])
def test_llama_cpp_names_without_a_format_are_refused(name):
    with pytest.raises(QuantConfigError, match=f"llama.cpp's {name} has no edgeflash format"):
        get_scheme(name)
