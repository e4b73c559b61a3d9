"""Other calculators' conventions, each named, cited and reproduced exactly.

    from memledger.calculators import ConventionInputs, get_convention
    get_convention("deepspeed-zero3").estimate(Ledger(n_params=2_851_000_000, dp=8),
                                               ConventionInputs(largest_layer=32_000_000))

A convention reads a :class:`~memledger.ledger.ledger.Ledger` and the few
:class:`~memledger.calculators.base.ConventionInputs` the ledger lacks.

Every convention's rows are exact integer bytes from SymPy formulas of its
own itemized parts; ``estimate(...).printed`` is the text the tool prints.
:data:`ERRATA` collects, per source, published numbers its own formula or
code contradicts, with the arithmetic. :mod:`memledger.calculators.compare`
puts one model under every convention next to memledger's exact ledger.
"""
from ..core.choices import lookup
from .accelerate import ACCELERATE, ACCELERATE_DOCS
from .base import Convention, ConventionInputs, Erratum, Estimate
from .deepspeed import ZERO2, ZERO2_DOCS, ZERO3
from .eleuther import TRANSFORMER_MATH, TRANSFORMER_MATH_16
from .hf import BEKMAN, HF_ANATOMY
from .megatron import MEGATRON, MEGATRON_DISTOPT
from .papers import PLAYBOOK, PLAYBOOK_20, ZERO_PAPER

CONVENTIONS = {c.name: c for c in (ZERO2, ZERO2_DOCS, ZERO3, ACCELERATE, ACCELERATE_DOCS, TRANSFORMER_MATH,
                                   TRANSFORMER_MATH_16, HF_ANATOMY, BEKMAN, MEGATRON, MEGATRON_DISTOPT, PLAYBOOK,
                                   PLAYBOOK_20, ZERO_PAPER)}
ERRATA = tuple(e for c in CONVENTIONS.values() for e in c.errata)


def get_convention(name: str) -> Convention:
    """The convention called ``name``; ``ValueError`` listing the known ones otherwise."""
    return lookup(CONVENTIONS, name, "convention")


__all__ = ["CONVENTIONS", "ERRATA", "Convention", "ConventionInputs", "Erratum", "Estimate", "get_convention"]
