"""Ops are found by their typed role (memledger.step.vocab.OpRole), set where each is made; an op's label is for
display only. A step's programs carry the roles the transforms look for, and nothing in memledger/step selects
an op by its label's text."""
from pathlib import Path
import re

import pytest

from memledger import Ledger
from memledger.activations.backends import get_backend
from memledger.step.build import build
from memledger.step.structure import StepStructure
from memledger.step.vocab import OpRole

STEP = Path(__file__).resolve().parents[2] / "memledger" / "step"
SMALL = dict(arch="llama2-7b", seq_len=512, overhead_bytes=0)


def roles(backend="article", **changes) -> list:
    ops = build(StepStructure.of(Ledger(**SMALL, **changes), get_backend(backend))).ops
    return [op.role for op in ops if op.role is not None]


def test_a_llama_step_carries_the_roles_its_transforms_find():
    found = set(roles("cpu"))
    assert {OpRole.LM_HEAD, OpRole.LOSS_COMPUTED, OpRole.LOSS_BACKWARD, OpRole.LM_HEAD_BACKWARD,
            OpRole.LOSS_RELEASED, OpRole.OPTIMIZER_STEP_DONE, OpRole.BLOCK_RETURNS, OpRole.QKV_PROJECTION,
            OpRole.OUTPUT_PROJECTION, OpRole.GATE_PROJECTION, OpRole.UP_PROJECTION, OpRole.DOWN_PROJECTION,
            OpRole.QKV_PROJECTION_BACKWARD, OpRole.OUTPUT_PROJECTION_BACKWARD, OpRole.GATE_PROJECTION_BACKWARD,
            OpRole.UP_PROJECTION_BACKWARD, OpRole.DOWN_PROJECTION_BACKWARD, OpRole.SWIGLU_PRODUCT_BACKWARD,
            OpRole.SILU_BACKWARD, OpRole.EMBEDDING_STEP} <= found
    # the cpu backend's composite RMSNorm: both block norms' backward nodes that read saved tensors
    assert {r for r in OpRole if r.name.startswith(("NORM1_", "NORM2_"))} <= found


@pytest.mark.parametrize("changes, role", [(dict(recompute="full"), OpRole.RECOMPUTATION_STOPS),
                                           (dict(loss_chunks=4), OpRole.DECODER_RETURNS),
                                           (dict(flash_attention=True), OpRole.FLASH_ATTENTION_BACKWARD),
                                           (dict(framework="fsdp2", recipe="fp32-adamw", dp=8), OpRole.FSDP2_CLEARED)])
def test_each_feature_marks_its_op(changes, role):
    assert role in roles("cpu", **changes)


def test_one_op_per_block_and_role_where_the_transforms_expect_one():
    """FSDP2's hooks and packing insert after the first op of a role: the outside programs have one of each."""
    found = roles("cpu")
    for role in (OpRole.LM_HEAD, OpRole.LOSS_COMPUTED, OpRole.LOSS_BACKWARD, OpRole.LOSS_RELEASED,
                 OpRole.OPTIMIZER_STEP_DONE, OpRole.EMBEDDING_STEP):
        assert found.count(role) == 1, role


def test_no_op_is_selected_by_its_label():
    """No comparison, membership, lookup or index by an op's label (a landmark's live set is recorded under its
    label, the landmark's name: a record, not a selection)."""
    selects = re.compile(r"\.label\s*(==|!=|\bin\b|\.startswith|\.endswith)|\bin\s+(op\.)?label\b|labels\.index|"
                         r"\[\s*op\.label\s*\](?!\s*=)|\.get\(\s*op\.label")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(STEP.glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if selects.search(line.split("#")[0])]
    assert found == []


#: Name matches by text (``startswith``, ``endswith``, ``rsplit``) still deciding in these modules, at most this many
#: each (others are removing them: issue 27); every other module of memledger/step has none.
TEXT_MATCHES_LEFT = {"ddp.py": 1, "tensor.py": 1}


def text_matches(path: Path) -> list:
    """The calls of ``str.startswith``, ``str.endswith`` and ``str.rsplit`` in ``path``'s code (docstrings and
    comments aside): a name matched by its text."""
    import ast
    return [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith", "rsplit")]


def test_no_tensor_parameter_or_recipe_is_selected_by_its_text():
    """A tensor, a saved row, a parameter or a recipe is chosen by a typed field (a ZeRO role, a lifetime, the
    optimizer a recipe runs) or its exact name, never by a prefix or suffix of it: a row renamed, or one added whose
    name happens to end the same way, would otherwise be dropped or kept in silence."""
    found = {path.name: text_matches(path) for path in sorted(STEP.glob("*.py"))}
    over = {name: lines for name, lines in found.items() if len(lines) > TEXT_MATCHES_LEFT.get(name, 0)}
    assert over == {}


def test_the_frozen_norms_rows_lora_drops_are_the_inventorys():
    """memledger.step.lora drops the composite RMSNorms' x*rstd rows (kept only for a frozen weight's gradient) by
    their exact names: they are every such row of the block's and the outside inventory, and nothing else."""
    from memledger.activations.inventory import inventory
    from memledger.activations.outside import outside_inventory
    from memledger.step.lora import NORM_WEIGHT_ONLY
    rows = inventory("swiglu", "RMSNorm", False, rmsnorm="composite") + outside_inventory("llama", rmsnorm="composite")
    products = [r.name for r in rows if r.name.endswith(" x*rstd")]
    assert sorted(products) == sorted(NORM_WEIGHT_ONLY) and len(products) == 3


@pytest.mark.parametrize("recipe, fp32_adapters, bitsandbytes", [
    ("fp32-adamw", True, False),            # FP32 adapters (PEFT's autocast_adapter_dtype), torch.optim.AdamW
    ("bf16-pure-adamw", False, False), ("bf16-adamw", False, False),
    ("bf16-adamw32-bnb", False, True)])     # bitsandbytes' paged_adamw_32bit: one fused in-place update
def test_lora_reads_its_adapters_dtype_and_optimizer_off_the_recipe(recipe, fp32_adapters, bitsandbytes):
    from memledger.states.recipes import get_recipe
    from memledger.step.lora import _bitsandbytes, _fp32_adapters
    assert (_fp32_adapters(get_recipe(recipe)), _bitsandbytes(get_recipe(recipe))) == (fp32_adapters, bitsandbytes)


#: What AdamW's step reads of each recipe the step models: (the moments' dtype, whether FP32 masters take the update),
#: as each recipe's components are declared (memledger/states/recipes.py, memledger/states/extra.py).
ADAMW_OF = {"bf16-adamw": ("fp32", True), "bf16-adamw-fp32-grads": ("fp32", True), "fp32-adamw": ("fp32", False),
            "bf16-pure-adamw": ("bf16", False), "bf16-sgd": (None, True), "fp32-sgd": (None, False),
            "bf16-sgd-momentum": (None, True), "fp32-sgd-momentum": (None, False),
            "bf16-pure-sgd-momentum": (None, False), "adafactor": ("fp32", False), "fp16-amp-adamw": ("fp32", False),
            "bf16-adam8bit-bnb": (None, True), "bf16-adam8bit-bnb-nomaster": (None, False),
            "bf16-adamw32-bnb": ("fp32", False)}


def test_adamw_reads_a_recipes_typed_states_not_its_component_names():
    """memledger.step.outer.adamw finds the second moment and the FP32 master weights by their typed State: the same
    answer for every modelled recipe with each component renamed."""
    from dataclasses import replace
    from memledger.states.recipes import get_recipe
    from memledger.step.outer import adamw
    from memledger.step.structure import MODELLED_RECIPES
    assert set(ADAMW_OF) == set(MODELLED_RECIPES)
    for name, expected in ADAMW_OF.items():
        recipe = get_recipe(name)
        renamed = replace(recipe, components=tuple(replace(c, name=f"state {i}") for i, c in enumerate(recipe.components)))
        assert adamw(recipe) == adamw(renamed) == expected, name


def test_the_fp8_recipes_are_refused_for_their_fp8_gemms_by_type():
    """check_recipe names FP8 GEMMs for a recipe whose matmuls run in FP8 (Recipe.fp8_gemms), whatever its name."""
    from dataclasses import replace
    from memledger.states.recipes import ALL_RECIPES
    from memledger.step import structure
    fp8 = [r for r in ALL_RECIPES.values() if r.fp8_gemms]
    assert fp8 and all(r.name not in structure.MODELLED_RECIPES for r in fp8)
    for recipe in fp8:
        with pytest.raises(ValueError, match=r"\(FP8 GEMMs: Transformer Engine or FP8 kernels"):
            structure.check_recipe(recipe.name)
    renamed = replace(fp8[0], name="te-gemms")
    structure.RECIPES["te-gemms"] = renamed
    try:
        with pytest.raises(ValueError, match=r"\(FP8 GEMMs"):
            structure.check_recipe("te-gemms")
    finally:
        del structure.RECIPES["te-gemms"]
    with pytest.raises(ValueError, match=r"\(its optimizer\)"):
        structure.check_recipe("not-a-recipe")


@pytest.mark.parametrize("recipe, masters", [("bf16-adamw", {"FP32 master weights"}), ("fp32-adamw", set()),
                                             ("bf16-adam8bit-bnb", {"FP32 master weights"})])
def test_the_replay_creates_the_optimizer_states_but_the_masters_at_the_first_step(recipe, masters):
    """memledger.ledger.replay leaves out of its lazily created states the step's masters, chosen by the recipe's
    typed component state (Built.masters), not by a name containing "master"."""
    from memledger.ledger.replay import _lazy
    built = build(StepStructure.of(Ledger(**SMALL, recipe=recipe), get_backend("cpu")))
    kinds = [(name, built.tensors[name].kind.value) for name in built.names]
    lazy = {kinds[j][0] for j in _lazy(kinds, built.masters)}
    assert built.masters == masters and lazy and lazy == {n for n, kind in kinds if kind == "optimizer"} - masters
