"""Packed oneDNN weights (engine/backends/torch/packed.py) must compute what the stock layers compute, keep the model's
parameters and files as they were, and follow in-place weight changes."""
import pytest
import torch
import torch.nn.functional as F

from engine.backends.torch import packed
from engine.backends.torch.packed import PackedLinear, pack_linears, product_by, stock_linears
from tests.tiny_torch import random_pair, random_target

pytestmark = pytest.mark.skipif(not packed.can_pack(torch.float32), reason="this torch build cannot pack weights")


def linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def packed_target(seed):
    target = random_target(seed=seed)
    pack_linears(target.model)
    return target


def test_a_cpu_target_runs_on_packed_linears_with_the_same_parameters():
    target = random_pair(seed=3).target
    assert all(type(m) is PackedLinear for m in linears(target.model))
    stock_keys = random_target(seed=3).model.state_dict()
    assert target.model.state_dict().keys() == stock_keys.keys()
    for key, value in target.model.state_dict().items():
        assert torch.equal(value, stock_keys[key]), key


@pytest.mark.parametrize("one_row_packed", [False, True])
def test_rows_match_the_stock_product_and_one_row_takes_the_path_measured_faster(monkeypatch, one_row_packed):
    monkeypatch.setattr(packed, "one_row_packed_is_faster", lambda shape, dtype: one_row_packed)
    layer = packed_target(4).model.model.layers[0].mlp.up_proj
    rows = torch.randn(1, 9, layer.in_features)
    with torch.inference_mode():
        torch.testing.assert_close(layer(rows), F.linear(rows, layer.weight), rtol=1e-5, atol=1e-5)
        one = rows[:, :1]
        torch.testing.assert_close(layer(one), F.linear(one, layer.weight), rtol=1e-5, atol=1e-5)
        expected = packed._packed_product(one, layer.packed) if one_row_packed else F.linear(one, layer.weight)
        assert torch.equal(layer(one), expected)


def test_a_packed_target_gives_the_stock_logits():
    target, stock = packed_target(5), packed_target(5)
    ids = torch.randint(0, 256, (1, 40))
    with torch.inference_mode():
        target.reset()
        ours, _ = target.forward(ids)
        with stock_linears(stock.model):
            stock.reset()
            theirs, _ = stock.forward(ids)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_stock_linears_switches_packing_off_and_back_on(monkeypatch):
    target = packed_target(6)
    calls = []
    monkeypatch.setattr(packed, "_packed_product", lambda *a: calls.append(1) or F.linear(a[0], torch.zeros(
        a[1].shape[0], a[0].shape[-1])))
    layer = target.model.model.layers[0].self_attn.o_proj
    rows = torch.randn(4, layer.in_features)
    with torch.inference_mode():
        with stock_linears(target.model):
            layer(rows)
        assert calls == []
        layer(rows)
    assert calls == [1]


def test_an_in_place_weight_change_is_seen_by_the_next_call():
    target = packed_target(7)
    head = target.model.lm_head
    rows = torch.randn(5, head.in_features)
    with torch.inference_mode():
        before = head(rows)
    with torch.no_grad():
        head.weight.mul_(3.0)
    with torch.inference_mode():
        torch.testing.assert_close(head(rows), 3.0 * before, rtol=1e-4, atol=1e-4)


def test_a_model_past_the_memory_limit_stays_stock(monkeypatch):
    monkeypatch.setattr(packed, "PACK_LIMIT_BYTES", 1000)
    target = packed_target(8)
    assert not any(isinstance(m, PackedLinear) for m in target.model.modules())


def test_a_packed_model_saves_and_loads_as_a_stock_one(tmp_path):
    from transformers import AutoModelForCausalLM
    target = packed_target(9)
    target.model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    for key, value in again.state_dict().items():
        assert torch.equal(value, target.model.state_dict()[key]), key


def test_product_by_packs_or_falls_back_to_the_stock_product(monkeypatch):
    weight, rows = torch.randn(12, 8), torch.randn(3, 8)
    torch.testing.assert_close(product_by(weight)(rows), F.linear(rows, weight), rtol=1e-5, atol=1e-5)
    assert product_by(weight)(torch.randn(0, 8)).shape == (0, 12)
    monkeypatch.setattr(packed, "can_pack", lambda dtype: False)
    assert torch.equal(product_by(weight)(rows), F.linear(rows, weight))


def test_gradients_flow_through_a_packed_layer_to_its_input():
    """Drafter training backpropagates through the target's frozen, packed LM head."""
    head = packed_target(10).model.lm_head
    head.weight.requires_grad_(False)
    rows = torch.randn(6, head.in_features, requires_grad=True)
    head(rows).square().sum().backward()
    expected = rows.detach().clone().requires_grad_()
    F.linear(expected, head.weight).square().sum().backward()
    torch.testing.assert_close(rows.grad, expected.grad, rtol=1e-4, atol=1e-4)
