"""The words memledger's accounts are made of, each a ``StrEnum``: a member is its string (``Device.GPU ==
"gpu"``, JSON prints ``"gpu"``), and a misspelt member (``Device.GUP``) fails where it is written, at import,
instead of silently booking bytes nowhere."""
from enum import StrEnum

__all__ = ["Device", "Group", "Kind", "Norm", "Role", "State", "Style"]


class Device(StrEnum):
    """Where bytes live."""
    GPU = "gpu"
    CPU = "cpu"
    NVME = "nvme"


class Group(StrEnum):
    """What a ledger row accounts for."""
    MODEL_STATES = "model_states"
    ACTIVATIONS = "activations"
    OVERHEAD = "overhead"
    INFERENCE = "inference"


class State(StrEnum):
    """What an optimizer-state component of a recipe is, for the step to find it by type, not by its name: the
    master weights the update is applied to, or the second moment (Adam's v, Adafactor's factored one)."""
    MASTER = "master weights"
    SECOND_MOMENT = "second moment"


class Role(StrEnum):
    """How ZeRO treats a model state (Rajbhandari et al. 2020): sharded from stage 3 (param), 2 (grad) or 1
    (optimizer); "gathered": ZeRO-3's gathered unit; "mixed": one sum over several roles, as a source books it."""
    PARAM = "param"
    GRAD = "grad"
    OPTIMIZER = "optimizer"
    GATHERED = "gathered"
    MIXED = "mixed"


class Kind(StrEnum):
    """What a tensor of the step timeline is (``memledger step --json``'s ``kind``)."""
    PARAM = "param"
    GRAD = "grad"
    OPTIMIZER = "optimizer"
    ACTIVATION = "activation"
    TRANSIENT = "transient"
    OVERHEAD = "overhead"


class Style(StrEnum):
    """A block style: GPT's (LayerNorm, biased linears, GeLU MLP, tied embeddings) or LLaMA's (RMSNorm, no
    biases, SwiGLU MLP, untied)."""
    GPT = "gpt"
    LLAMA = "llama"


class Norm(StrEnum):
    """A block's normalization."""
    LAYERNORM = "LayerNorm"
    RMSNORM = "RMSNorm"
