import pytest
import sympy as sp

from memledger.activations.flops import recompute_overhead, training_flops
from memledger.core.symbols import L, S, V, d


@pytest.mark.slow
def test_full_recompute_costs_about_a_third():
    # one extra forward pass: forward is 1/3 of forward + backward (backward = 2 x forward)
    limit = sp.limit(sp.limit(recompute_overhead("full"), V, 0), S, 0)
    assert limit == sp.Rational(1, 3)


@pytest.mark.slow
def test_selective_is_cheaper_than_full():
    at = {S: 2048, d: 4096, V: 32000, L: 32}
    assert 0 < recompute_overhead("selective").subs(at) < recompute_overhead("full").subs(at)


def test_bad_recompute():
    with pytest.raises(ValueError, match="recompute"):
        training_flops("half")


@pytest.mark.slow
def test_itemized_matmuls_give_the_model_flops():
    from memledger.activations.flops import forward_flops_per_layer
    from memledger.core.symbols import B
    logits = 2 * B * S * d * V                      # forward of the output layer
    derived = 3 * (L * forward_flops_per_layer() + logits)   # backward = 2 x forward
    assert sp.simplify(derived - training_flops("none")) == 0
