"""What parallel training sends over the network each step, per GPU, as formulas.

Collectives over N ranks on a ring (Patarasuk & Yuan 2009; the NCCL algorithm
for large messages): a reduce-scatter or an all-gather of a tensor of n
elements sends (N-1)/N * n elements from each rank; an all-reduce is a
reduce-scatter followed by an all-gather, 2(N-1)/N * n.

Data parallelism and ZeRO (Rajbhandari et al. 2020, Sec. 7): plain data
parallelism all-reduces the gradients, 2P elements per step for large N.
ZeRO stages 1 and 2 reduce-scatter the gradients and all-gather the updated
parameters: the same 2P. Stage 3 all-gathers the parameters twice (forward
and backward) and reduce-scatters the gradients: 3P, 1.5x.

Tensor parallelism (Shoeybi et al. 2019; Korthikanti et al. 2022, Sec. 4.2.2):
every layer all-reduces its B*S*d activations twice in forward and twice in
backward (after attention and after the MLP). Sequence parallelism replaces
each all-reduce by a reduce-scatter and an all-gather of the same volume.

Pipeline parallelism: point-to-point sends between neighbouring stages, one
activation per micro-batch forward and its gradient backward, each of the
shape Megatron-LM allocates for them (``megatron/core/pipeline_parallel/
schedules.py``, ``get_tensor_shapes``: seq_length x micro_batch_size x
hidden_size, seq_length divided by the tensor-parallel size under sequence
parallelism).
"""
from ..core.choices import check_choice
from ..states.placement import ZERO_STAGES

__all__ = ["COLLECTIVES", "data_parallel_elements", "pipeline_elements", "ring_elements", "tensor_parallel_elements"]

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather")


def ring_elements(collective: str, n_elements, ranks):
    """Elements each rank sends in a ring ``collective`` over ``ranks`` ranks:
    (N-1)/N * n for reduce-scatter and all-gather, 2(N-1)/N * n for all-reduce."""
    check_choice("collective", collective, COLLECTIVES)
    share = (ranks - 1) * n_elements / ranks
    return 2 * share if collective == "all-reduce" else share


def data_parallel_elements(zero_stage: int = 0):
    """Gradient/parameter elements each rank sends per step under ZeRO ``zero_stage`` over N_d ranks.

    Stages 0-2: 2(N_d-1)/N_d * P (-> 2P, the ZeRO paper's figure); stage 3: 3(N_d-1)/N_d * P (-> 3P).
    """
    from ..core.symbols import N_d, P
    check_choice("zero_stage", zero_stage, ZERO_STAGES)
    if zero_stage < 3:
        return ring_elements("reduce-scatter", P, N_d) + ring_elements("all-gather", P, N_d)
    return ring_elements("reduce-scatter", P, N_d) + 2 * ring_elements("all-gather", P, N_d)


def tensor_parallel_elements(sequence_parallel: bool = False):
    """Activation elements each rank sends per step for L layers over t ranks:
    4 all-reduces of B*S*d per layer (2 forward, 2 backward), 8(t-1)/t * L*B*S*d; sequence
    parallelism sends the same as 4 reduce-scatters + 4 all-gathers (Korthikanti et al. 2022)."""
    from ..core.symbols import B, L, S, d, t
    size = B * S * d
    if sequence_parallel:
        per_layer = 4 * (ring_elements("reduce-scatter", size, t) + ring_elements("all-gather", size, t))
    else:
        per_layer = 4 * ring_elements("all-reduce", size, t)
    return L * per_layer


def pipeline_elements(sequence_parallel: bool = False):
    """Activation elements an inner pipeline stage sends per step: for each of m micro-batches one
    B*S*d activation forward (to the next stage) and one B*S*d gradient backward (to the previous
    one), 2*m*B*S*d; with sequence parallelism each tensor-parallel rank sends its S/t slice,
    2*m*B*S*d/t. The first and the last stage send half of it."""
    from ..core.symbols import B, S, d, m, t
    check_choice("sequence_parallel", sequence_parallel, (False, True))
    shape = B * S * d / t if sequence_parallel else B * S * d
    return m * (shape + shape)
