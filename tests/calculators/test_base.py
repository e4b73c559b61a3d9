"""What a convention reads of a Ledger and of ConventionInputs: the GPUs each tool counts under tensor parallelism."""
import pytest

from memledger.calculators import ConventionInputs, get_convention
from memledger.ledger.ledger import Ledger

P = 8 * 10**9                       # divisible by every GPU count below: no floor() or ceiling() in the way


def states(name, ledger, inputs=None):
    return get_convention(name).estimate(ledger, inputs).total("gpu", "model_states")


@pytest.mark.slow
@pytest.mark.parametrize("dp, tp", [(8, 1), (8, 2), (4, 4)])
def test_each_tool_counts_the_gpus_its_own_way(dp, tp):
    ledger = Ledger(n_params=P, dp=dp, tp=tp, zero_stage=1)
    # DeepSpeed's estimators take GPUs per node x nodes, every GPU of the job (stage_1_and_2.py line 2441:
    # total_gpus = num_nodes * num_gpus_per_node): 2P + floor(18P / N), N = dp x tp
    assert states("deepspeed-zero2", ledger) == 2 * P + 18 * P // (dp * tp)
    # EleutherAI's cookbook divides the optimizer by num_gpus = dp x tp x pp (calc_transformer_mem.py line 264) and
    # the weights by tp: 2P/t + 4P + 12P/N
    assert states("eleuther", ledger) == 2 * P // tp + 4 * P + 12 * P // (dp * tp)
    # The Playbook and the ZeRO paper shard over the data-parallel degree N_d (Playbook line 878: 2P + 2P + kP/N_d)
    assert states("playbook", ledger) == states("zero-paper", ledger) == 4 * P + 12 * P // dp


@pytest.mark.slow
def test_megatron_data_parallel_size_is_the_ledgers_dp():
    # theoretical_memory_usage.py lines 293-296: 2 + 4 + 12/d bytes per parameter of the tp shard with the distributed
    # optimizer, d = world size / (tp x pp): the ledger's dp, 8 here, not the 16 GPUs
    from memledger.calculators.explain import megatron_params
    ledger = Ledger("llama2-7b", dp=8, tp=2)
    shard = megatron_params(ledger.arch, tp=2)
    assert states("megatron", ledger) == (2 + 4 + 12) * shard
    assert states("megatron-distopt", ledger) == (2 + 4) * shard + -(-12 * shard // 8)


def test_gpus_per_node_and_nodes_split_the_ledgers_gpus():
    ledger = Ledger(n_params=P, dp=8, tp=2)
    assert ConventionInputs(nodes=2).per_node(ledger) == 8
    with pytest.raises(ValueError, match=r"gpus_per_node x nodes \(4 x 2\) must equal dp x tp \(16\)"):
        ConventionInputs(gpus_per_node=4, nodes=2).per_node(ledger)


def test_a_convention_names_what_it_reads():
    from memledger.calculators import CONVENTIONS
    from memledger.calculators.base import READABLE
    for c in CONVENTIONS.values():
        assert set(c.reads) <= set(READABLE), c.name
    with pytest.raises(ValueError, match="reads unknown inputs"):
        type(CONVENTIONS["eleuther"])("x", "x", "x", lambda ledger, inputs: [], reads=("banana",))
