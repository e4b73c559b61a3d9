"""The book's checks: prose without typed quantities, committed outputs, every glued number and
equation against a source that is not the glue (the article's figure, a published number, or
arithmetic on the article's inputs written out here), and a clean strict build.

Each glued value is read back from the chapters' committed outputs (which nbval keeps equal to a
fresh run) and, in the slow build test, from the glue files of a clean strict build.
"""
from fractions import Fraction
from html.parser import HTMLParser
import json
from pathlib import Path
import re

import pytest
import sympy as sp

from memledger.book import CLAIM_BY_ID
from memledger.claims import CLAIMS

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
UNITS = r"(?:GB|GiB|MB|MiB|TB|TiB|bytes|B/param|GB/s)"
#: a digit-led quantity with a unit, outside glue roles, math and “article quotations”
TYPED_QUANTITY = re.compile(r"(?<![\w{`.$])\d[\d,.]*\s?" + UNITS + r"\b")

# --- independent values: the article's inputs and published numbers, written out here -------------

P = 7 * 10**9                         # the article's nominal parameter count
BSD = 2048 * 4096                     # B x S x d at the spec (B = 1, S = 2048, d = 4096)
LAYERS = 32
ACT = LAYERS * BSD * 114              # L x BSd x (34 + 5HS/d), the article's per-layer formula at the spec
STATES = 16 * P                       # 2 + 2 + 4 + 4 + 4 bytes per parameter (article; ZeRO's K = 12)
OVERHEAD = 2 * 10**9                  # the upper end of the article's 1-2 GB, used in its sums
GB, GiB, MiB = 10**9, 2**30, 2**20
MODEL_FLOPS_TERMS = 1 + Fraction(2048, 6 * 4096) + Fraction(32000, 12 * 4096 * LAYERS)   # 1 + S/6d + V/12dL
MODEL_FLOPS_S2 = Fraction(2048, 6 * 4096)                                                 # the S^2 matmuls: S/6d

#: glue key -> (exact value, unit as printed). Sources: the article's arithmetic, vendors' data sheets,
#: the papers cited in the chapters.
EXPECTED = {
    "gpu.a100": (80, "GB"),                                                  # NVIDIA A100 80GB data sheet
    "gpu.rtx4090": (24, "GB"),                                               # NVIDIA RTX 4090 specifications
    "offload_only.gpu": (Fraction(4 * P + ACT + OVERHEAD, GB), "GB"),         # 14 + 14 + 30.6 + 2
    # chapter 2: GPT blocks of 12d^2 + 13d (Korthikanti et al. 2022), a tied 32000 x d embedding, a final LayerNorm
    "params.article_blocks": (Fraction(LAYERS * (12 * 4096**2 + 13 * 4096), 10**9), "billion"),
    "params.article_total": (Fraction(LAYERS * (12 * 4096**2 + 13 * 4096) + 32000 * 4096 + 2 * 4096, 10**9), "billion"),
    "spec.vocab": (32000, ""),                                               # LLaMA-2's vocabulary
    "params.llama2_7b": (6_738_415_616, ""),                                 # the released Llama-2-7b checkpoint
    "params.llama2_7b_b": (Fraction(6_738_415_616, 10**9), "billion"),
    # chapter 3
    "bf16.spacing": (Fraction(1, 2**7), ""),                                 # 7 fraction bits: spacing 2^-7 in [1, 2)
    "recipe.fp32_grads": (2 + 4 + 12, "B/param"),                            # HF "model memory anatomy": 18
    "recipe.sgd": (2 + 2 + 8, "B/param"),                                    # Transformer Math 101: master + momentum
    "recipe.adam8bit": (2 + 2 + 6, "B/param"),                               # Transformer Math 101: master + 1 + 1
    "states.gib": (Fraction(STATES, GiB), "GiB"),
    "states.llama2_7b": (Fraction(16 * 6_738_415_616, GB), "GB"),
    # chapter 4: Korthikanti's inventory at the spec, and its variants
    "act.layer_bytes": (BSD * 114, "bytes"),
    "act.layer_mib": (Fraction(BSD * 114, MiB), "MiB"),
    "act.layer_gib": (Fraction(BSD * 114, GiB), "GiB"),
    "act.total_gib": (Fraction(ACT, GiB), "GiB"),
    "act.nodrop_total": (Fraction(LAYERS * BSD * (32 + 2 * 32 * 2048 // 4096), GB), "GB"),   # no masks, one S^2 tensor less
    "act.flash_total": (Fraction(LAYERS * (BSD * 34 + 4 * 32 * 2048), GB), "GB"),            # 34 BSd + FP32 log-sum-exp
    "act.llama_total": (Fraction(LAYERS * 2 * 2048 * (4 * 11008 + 32 * 2048 + 8 * 4096), GB), "GB"),  # 2BS(4F + HS + 8d)
    # chapter 6: gradients, master, Adam and activations against the 66 GB beside the weights
    "headroom.times": (Fraction(STATES - 2 * P + ACT, 80 * GB - 2 * P), "x"),
    # chapter 7: full checkpointing keeps L x BSd x 2 (article); selective keeps 34 BSd per layer (Korthikanti)
    "ckpt.gib": (Fraction(2 * LAYERS * BSD, GiB), "GiB"),
    "ckpt.selective_total": (Fraction(34 * LAYERS * BSD, GB), "GB"),
    # extra FLOPs over the model FLOPs 72BLSd^2(1 + S/6d + V/12dL): one more forward of the two S^2 matmuls
    # (4BS^2d per layer), and Korthikanti's hardware-FLOPs formula (S/6d -> S/3d)
    "ckpt.selective_flops": (100 * MODEL_FLOPS_S2 / 3 / MODEL_FLOPS_TERMS, "%"),
    "ckpt.selective_flops_paper": (100 * MODEL_FLOPS_S2 / MODEL_FLOPS_TERMS, "%"),
    # chapter 8: ZeRO-Offload moves 2P down and 2P up per step (Ren et al. 2021); the article's links
    "offload.traffic": (Fraction(4 * P, GB), "GB"),
    "offload.seconds": (Fraction(4 * P, 32 * GB), "s"),
    "offload.seconds_duplex": (Fraction(2 * P, 32 * GB), "s"),
    "offload.article_seconds": (Fraction(84, 32), "s"),                      # the article's 84 GB at 32 GB/s
    "offload.zero_gpu": (Fraction(2 * P + 2 * LAYERS * BSD + OVERHEAD, GB), "GB"),
    "offload.zero_cpu": (Fraction((2 + 12) * P, GB), "GB"),
    "link.pcie4": (32, "GB/s"), "link.nvme3": (3, "GB/s"), "link.nvme7": (7, "GB/s"),
    "offload.nvme_gb": (Fraction(2 * 12 * P, GB), "GB"),                    # FP32 states read and written
    "offload.nvme_seconds_slow": (Fraction(24 * P, 3 * GB), "s"),
    "offload.nvme_seconds_fast": (Fraction(24 * P, 7 * GB), "s"),
    # chapter 9: the largest micro-batch of 2048-token sequences on 80 GB: (80 GB - resident) / per-sequence activations
    "together.max_batch": ((80 * GB - 4 * P - OVERHEAD) // (2 * LAYERS * BSD), ""),   # 14 + 14 + 2 GB resident
    "offload.max_batch": ((80 * GB - 4 * P - OVERHEAD) // ACT, ""),
    # AdamW on the host: read the 2-byte gradient, read and write 12 bytes of FP32 state, write the 2-byte weight,
    # at the 204.8 GB/s of 8 DDR4-3200 channels (Tom's Hardware, 2021-12-09)
    "host.bandwidth": (Fraction(2048, 10), "GB/s"),
    "cpu_adam.bytes": (Fraction(28 * P, GB), "GB"),
    "cpu_adam.seconds": (Fraction(28 * P, 204_800_000_000), "s"),
    # chapter 13: every convention's own arithmetic for the article's 7B (B = 1, S = 2048, one GPU)
    "calc.memledger": (Fraction(STATES + ACT, GB), "GB"),
    "calc.low": (Fraction(2 * 4 * P, GB), "GB"),                            # accelerate: optimizer phase, 2 x fp32 size
    "calc.high": (Fraction(20 * P + ACT, GB), "GB"),                        # Playbook with FP32 grad accumulation
    "calc.ratio": (Fraction(20 * P + ACT, 8 * P), "x"),
    "calc.bpp.hf": (6 + 8 + 4, "B/param"),                                  # HF model_memory_anatomy.md: 18 bytes
    "calc.bpp.zero2": (2 + 2 + 4 + 4 + 8, "B/param"),                       # DeepSpeed stage_1_and_2.py l. 2445
    "calc.bpp.zero3": (18 + Fraction(4 * 32000 * 4096, P), "B/param"),     # stage3.py: 4 x largest layer + 18P/N
    "calc.bpp.accelerate": (8, "B/param"),
    "calc.largest": (32000 * 4096, ""),                                     # the embedding, V x d
    "calc.ds.printed": (Fraction(20 * P, GiB), "GiB"),                      # DeepSpeed prints x / 2^30 as "GB"
    "calc.ds.gb": (Fraction(20 * P, GB), "GB"),
    "calc.ds.cpu": (Fraction(4 * P * 3, 2 * GB), "GB"),                     # P x 4 x GPUs per node x 1.5
    "calc.ds.buffer": (Fraction(3, 2), ""),                                 # additional_buffer_factor=1.5
    "calc.acc.sum": (4 * (1 + Fraction(3, 2) + 2 + 2), "B/param"),          # model S, grads 1.5S, optimizer 2S, step 2S
    "calc.acc.printed": (Fraction(8 * P, GiB), "GiB"),
    # Megatron counts L(4d^2 + 2dF + 4d) + Vd + 2d: no biases, tied embedding (theoretical_memory_usage.py)
    "calc.megatron.params": (Fraction(32 * (4 * 4096**2 + 2 * 4096 * 16384 + 4 * 4096) + 32000 * 4096 + 2 * 4096,
                                      10**9), "billion"),
    "calc.act.ours": (Fraction(ACT, GB), "GB"),
    "calc.act.zero": (Fraction(24 * LAYERS * BSD, GB), "GB"),               # ZeRO Sec. 3.2: ~12 x hidden 2-byte values
    "calc.act.bekman": (Fraction(LAYERS * 28 * 2 * BSD + 4 * 2048 * 32000, GB), "GB"),   # 28 copies + fp32 logits
    "calc.act.copies": (28, ""),                                            # Bekman: Llama-3.1-8B, 28 copies
    # Megatron without SP: 1.05 x [SBd(10 + 24) L + 8SB + SBd + 2(SBV + SBd)]
    "calc.act.megatron": (Fraction(105, 100) * (34 * LAYERS * BSD + 8 * 2048 + BSD + 2 * (2048 * 32000 + BSD))
                          / GB, "GB"),
    "calc.act.meg_per": (10 + 24, ""), "calc.act.kept_per": (34 + 5 * 32 * 2048 // 4096, ""),
    # DeepSpeed memory.rst line 30 prints 15.93GB for t5-3b (2,851,598,336 parameters) on 8 GPUs
    "calc.ds.docs": (Fraction(4 * 2_851_598_336 + 16 * 2_851_598_336 // 8, GiB), "GiB"),
    "calc.ds.code": (Fraction(2 * 2_851_598_336 + 18 * 2_851_598_336 // 8, GiB), "GiB"),
    "calc.ex1.base": (Fraction(6_738_415_616 - 32000 * 4096, 10**9), "billion"),
    "calc.ex1.gb": (Fraction(8 * (6_738_415_616 - 32000 * 4096), GB), "GB"),
    "calc.ex1.gib": (Fraction(8 * (6_738_415_616 - 32000 * 4096), GiB), "GiB"),
    "calc.ex1.head": (32000 * 4096, ""),
    "calc.ex2.gpus": (-(-18 * P // (24 * GB - 4 * 32000 * 4096)), ""),
    "calc.ex2.at": (Fraction(4 * 32000 * 4096 + 18 * P // 6, GB), "GB"),
    "calc.ex2.before": (Fraction(4 * 32000 * 4096 + 18 * P // 5, GB), "GB"),
    "calc.ex3.cookbook": (Fraction(34 * LAYERS * BSD, GB), "GB"),
    "calc.ex3.full": (Fraction(2 * LAYERS * BSD, GB), "GB"),
}

#: equation key -> the right-hand side as the article (and its source paper) writes it
EQUATIONS = {
    "eq.activations": "B*S*d*(34 + 5*H*S/d)",         # Korthikanti et al. 2022, Eq. 1
    "eq.states": "(2 + 2 + 4 + 4 + 4)*P",              # the article; ZeRO: (2 + 2 + K) Psi, K = 12
    "eq.checkpoint": "L*B*S*d*2",                      # the article's full checkpointing
    "eq.distopt": "6 + 12/N_d",                        # Megatron-LM dist_optimizer.md lines 16-20
}
_SYMBOLS = {name: sp.Symbol(name) for name in ("B", "S", "d", "H", "L", "P", "V", "F")}

_NUMBER = re.compile(r"^(?P<number>-?[\d,]*\.?\d+)\s*(?P<unit>.*)$")


def parse(text: str):
    """("30.6 GB") -> (Fraction(153, 5), "GB", 1): the number, its unit and its printed decimals."""
    match = _NUMBER.match(text.strip().strip("'\""))
    assert match, f"not a number with a unit: {text!r}"
    number = match["number"].replace(",", "")
    decimals = len(number.partition(".")[2])
    unit = {"×": "x"}.get(match["unit"], match["unit"])
    return Fraction(number), unit, decimals


def _article_agrees(claim, shown: Fraction, decimals: int) -> bool:
    """Whether a printed value of ``claim`` says what the article says, given the claim's relation."""
    want = claim.value
    if claim.relation == ">":
        return shown > want
    if claim.relation == "<":
        return shown < want
    step = Fraction(1, 10**claim.digits)
    slack = step if "truncat" in claim.note else step / 2          # truncation: up to one printed digit
    if claim.relation == "~":
        slack = max(slack, claim.tolerance * want)
    return abs(shown - want) <= slack + Fraction(1, 2 * 10**decimals)


def problems(glued: dict) -> list:
    """Every glued value that disagrees with its independent source, or has none."""
    found = []
    for (chapter, key), data in sorted(glued.items()):
        where = f"{chapter}: {key}"
        if key in EQUATIONS:
            rhs = sp.sympify(data["text/plain"], locals=_SYMBOLS)
            if sp.expand(rhs - sp.sympify(EQUATIONS[key], locals=_SYMBOLS)) != 0:
                found.append(f"{where}: {data['text/plain']} is not {EQUATIONS[key]}")
            continue
        shown, unit, decimals = parse(data["text/plain"])
        if key in CLAIM_BY_ID:
            claim = CLAIM_BY_ID[key]
            if unit != claim.unit:
                found.append(f"{where}: unit {unit!r}, the article's is {claim.unit!r}")
            elif claim.status == "erratum":
                if _article_agrees(claim, shown, decimals) or data["text/plain"].strip("'") not in claim.note:
                    found.append(f"{where}: an erratum must print the value its note's arithmetic gives")
            elif not _article_agrees(claim, shown, decimals):
                found.append(f"{where}: {data['text/plain']} disagrees with the article's {claim.stated} {claim.unit}")
        elif key in EXPECTED:
            value, expected_unit = EXPECTED[key]
            if unit != expected_unit or abs(shown - Fraction(value)) > Fraction(1, 2 * 10**decimals):
                found.append(f"{where}: {data['text/plain']}, expected {float(value):.6g} {expected_unit}")
        else:
            found.append(f"{where}: no independent value to check it against (add it to EXPECTED)")
    return found


def committed_glue() -> dict:
    """(chapter, key) -> {"text/plain": ..., ...}: what the chapters' committed outputs glue."""
    glued = {}
    for path in CHAPTERS:
        for cell in json.loads(path.read_text())["cells"]:
            for output in cell.get("outputs", []):
                record = output.get("metadata", {}).get("scrapbook")
                if record:
                    prefix = record["mime_prefix"]
                    glued[(path.stem, record["name"])] = {k[len(prefix):]: v for k, v in output["data"].items()}
    return glued


# --- fast checks ---------------------------------------------------------------------------------

def markdown_cells(path):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


def strip_allowed(text):
    text = re.sub(r"\{glue:?\w*\}`[^`]*`", "", text)               # glued values
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", "", text, flags=re.S)  # math
    text = re.sub(r"“[^”]*”", "", text)                             # quotations of the article
    text = re.sub(r"```.*?```", "", text, flags=re.S)               # code blocks
    return re.sub(r"`[^`]*`", "", text)                             # inline code


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_hand_typed_quantities_in_prose(path):
    typed = [hit for cell in markdown_cells(path) for hit in TYPED_QUANTITY.findall(strip_allowed(cell))]
    assert typed == [], "glue these from memledger, or quote the article in “…”"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_outputs_are_committed(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert cells and all(c["execution_count"] is not None for c in cells), "run scripts/execute_notebooks.py"


@pytest.mark.parametrize("path", [p for p in CHAPTERS if p.stem[0].isdigit()], ids=lambda p: p.stem)
def test_chapter_shape(path):
    prose = "\n".join(markdown_cells(path))
    for part in ("What you'll learn", "## Takeaways", "## Exercises"):
        assert part in prose
    assert "```{code-cell}" not in prose
    source = path.read_text()
    assert '"name": "fig-' in source, "each chapter has at least one named figure"
    assert "import memledger as ml" in source


#: what a reader should not have to read: evaluation machinery, argument-order tuples, the CLI's entry point,
#: private names
PLUMBING = re.compile(r"exact_function|vectorized_function|ml\.evaluate\b|\bARGS\b|\bmain\(\[|import _|\b_[a-z]\w*\(")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_library_plumbing_in_chapters(path):
    code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert [line for cell in code for line in cell.splitlines() if PLUMBING.search(line)] == []


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_figures_have_alt_text_and_captions(path):
    for cell in json.loads(path.read_text())["cells"]:
        if "mystnb" in cell["metadata"] and "figure" in cell["metadata"]["mystnb"]:
            meta = cell["metadata"]["mystnb"]
            assert meta["figure"]["caption"].strip() and meta["figure"]["name"].startswith("fig-")
            assert len(meta.get("image", {}).get("alt", "")) > 20, meta["figure"]["name"]


def test_every_glued_value_agrees_with_an_independent_source():
    glued = committed_glue()
    assert len(glued) > 80
    assert problems(glued) == []


def test_the_article_figures_are_all_still_printed():
    """The audit appendix prints every claim; the chapters glue at least the article's headline figures."""
    keys = {key for _, key in committed_glue()}
    for claim_id in ("states.total", "act.total", "ledger.total", "ckpt.ledger", "offload.gpu", "offload.cpu"):
        assert claim_id in keys


# --- the build (slow; fixture ``build`` in conftest.py, one clean strict build shared with test_browser.py) ---


def build_glue(build) -> dict:
    glued = {}
    for path in (build / "jupyter_execute").rglob("*.glue.json"):
        for key, output in json.loads(path.read_text()).items():
            glued[(path.name.removesuffix(".glue.json"), key)] = output["data"]
    return glued


@pytest.mark.slow
def test_built_pages_glue_the_checked_values(build):
    glued = build_glue(build)
    assert {k for k in glued} == set(committed_glue())
    assert problems(glued) == []


@pytest.mark.slow
def test_build_publishes_every_chapter(build):
    for path in CHAPTERS:
        assert (build / "html" / "book" / f"{path.stem}.html").exists()
    assert (build / "html" / "index.html").exists()


@pytest.mark.slow
def test_audit_lists_every_claim(build):
    page = (build / "html" / "book" / "audit.html").read_text()
    missing = [c.id for c in CLAIMS if c.id not in page]
    assert missing == []


@pytest.mark.slow
def test_notation_table_is_html_with_math(build):
    page = (build / "html" / "book" / "notation.html").read_text()
    assert "| symbol |" not in page and "<table" in page
    assert page.count('<span class="math notranslate nohighlight">') >= 11


class _Assets(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.urls.append(attrs["src"])
        if tag == "link" and attrs.get("rel") in ("stylesheet", "preload", "modulepreload") and attrs.get("href"):
            self.urls.append(attrs["href"])


@pytest.mark.slow
def test_site_loads_nothing_from_the_network(build):
    for page in (build / "html").rglob("*.html"):
        parser = _Assets()
        parser.feed(page.read_text())
        remote = [u for u in parser.urls if re.match(r"^(https?:)?//", u)]
        assert remote == [], page.name
    for asset in ("vendor/require.js", "vendor/html-manager/embed-amd.js", "vendor/mathjax/tex-mml-chtml.js"):
        assert (build / "html" / asset).exists()


@pytest.mark.slow
def test_math_and_widgets_use_the_vendored_copies(build):
    page = (build / "html" / "book" / "09_together.html").read_text()
    assert 'src="../_static/../vendor/require.js' in page
    assert 'src="../_static/../vendor/html-manager/embed-amd.js' in page
    assert "application/vnd.jupyter.widget-state+json" in page      # the explorer's state is embedded
    assert "needs a running" in page or "running Jupyter kernel" in page
    assert "../vendor/mathjax/tex-mml-chtml.js" in (build / "html" / "book" / "04_activations.html").read_text()


@pytest.mark.slow
def test_static_calculator_is_in_the_page(build):
    page = (build / "html" / "book" / "09_together.html").read_text()
    assert 'class="memledger-calculator"' in page and 'class="memledger-calculator-data"' in page
    assert "_static/memledger-calculator.js" in page
