"""Communication volumes against the ZeRO paper (Sec. 7) and Korthikanti et al. (2022, Sec. 4.2.2)."""
import pytest
import sympy as sp

from memledger.answers.communication import (data_parallel_elements, pipeline_elements, ring_elements,
                                    tensor_parallel_elements)
from memledger.core.symbols import B, L, N_d, P, S, d, m, t


@pytest.mark.parametrize("stage, paper", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_zero_volumes_tend_to_the_papers_2p_and_3p(stage, paper):
    # ZeRO Sec. 7.2-7.3: "2Psi" for baseline DP and P_os+g, "3Psi" for P_os+g+p (large N_d)
    assert sp.limit(data_parallel_elements(stage), N_d, sp.oo) == paper * P


def test_zero3_is_one_and_a_half_times_data_parallel():
    assert sp.simplify(data_parallel_elements(3) / data_parallel_elements(0)) == sp.Rational(3, 2)


def test_one_rank_sends_nothing():
    assert data_parallel_elements(0).subs(N_d, 1) == 0
    assert tensor_parallel_elements().subs(t, 1) == 0


def test_sequence_parallel_sends_what_tensor_parallel_sends():
    # Korthikanti et al. 2022, Sec. 4.2.2: reduce-scatter + all-gather have the bandwidth of one all-reduce
    assert sp.simplify(tensor_parallel_elements(True) - tensor_parallel_elements(False)) == 0


def test_tensor_parallel_four_all_reduces_per_layer():
    # Shoeybi et al. 2019, Fig. 4: two all-reduces in forward and two in backward per layer
    assert sp.limit(tensor_parallel_elements() / (L * B * S * d), t, sp.oo) == 8


def test_unknown_collective():
    with pytest.raises(ValueError, match="collective"):
        ring_elements("broadcast", 1, 2)


def test_pipeline_sends_one_activation_and_one_gradient_per_microbatch():
    # Megatron-LM get_tensor_shapes: (seq_length, micro_batch_size, hidden_size) per send, seq_length / t with SP
    assert sp.expand(pipeline_elements() - 2 * m * S * B * d) == 0
    assert sp.expand(pipeline_elements(sequence_parallel=True) - 2 * m * (S / t) * B * d) == 0
    with pytest.raises(ValueError, match="sequence_parallel"):
        pipeline_elements("yes")
