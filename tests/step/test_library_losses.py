"""The libraries' losses as memledger models them (memledger/step/loss.py), without PyTorch: torchtune 0.6.1's
``chunk`` split, and the setups it cannot split into the chunks asked for. The byte-for-byte proofs against
torchtune's own code are in tests/pytorch/test_torchtune_litgpt.py."""
import pytest
import sympy as sp

from memledger.core.symbols import S
from memledger.ledger.ledger import Ledger
from memledger.models.architecture import Architecture
from memledger.step.implementations import check_torchtune_chunks
from memledger.step.loss import torchtune_chunk_tokens


@pytest.mark.parametrize("seq, n, sizes", [
    (203, 8, [26] * 7 + [21]),      # chunk: ceil(203/8) = 26 each, the last 203 - 7*26; tensor_split: 3 x 26, 5 x 25
    (200, 8, [25] * 8),
    (1023, 8, [128] * 7 + [127]),
    (10, 4, [3, 3, 3, 1]),
])
def test_torchtune_chunk_sizes(seq, n, sizes):
    """``torch.chunk``'s documented split: chunks of ceil(S/n), the last what is left."""
    got = [int(sp.sympify(torchtune_chunk_tokens(k, n)).subs(S, seq)) for k in range(n)]
    assert got == sizes and sum(got) == seq


@pytest.mark.parametrize("seq, n", [(9, 4), (6, 4), (5, 4)])
def test_fewer_chunks_refused(seq, n):
    """chunk(4) of 9 tokens makes 3 chunks of 3: torchtune zips 3 logit chunks with 3 label chunks, not 4."""
    with pytest.raises(ValueError, match="loss_chunks"):
        check_torchtune_chunks(n, seq)


@pytest.mark.slow
def test_refused_in_one_line_by_the_step():
    arch = Architecture(64, 2, 4, 172, 1000, "llama")
    with pytest.raises(ValueError, match=r"torchtune's h.chunk\(4, dim=1\) makes 3 chunks of 3 tokens"):
        Ledger(arch, batch_size=1, seq_len=9, recipe="bf16-pure-adamw", loss_chunks=4,
               implementation="torchtune").step("cpu")


def test_torchtune_chunked_loss_is_modelled():
    arch = Architecture(64, 2, 4, 172, 1000, "llama")
    step = Ledger(arch, batch_size=2, seq_len=203, recipe="bf16-pure-adamw", loss_chunks=8,
                  implementation="torchtune").step("cpu")
    assert step.peak.bytes > 0
