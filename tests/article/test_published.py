"""The published GPU measurements of chapter 20: each row's figure as its source prints it, the measure it matches,
and memledger's prediction with the relative error, computed for every row."""
from fractions import Fraction

from memledger.article.published import PUBLISHED, compare

GB, MiB = 10**9, 2**20


def test_printed_figures_are_read_in_the_sources_units():
    values = {row.id: row.value for row in PUBLISHED}
    assert values["tt-qlora"] == 9_290_000_000               # torchtune: max_memory_reserved() / 1e9, "9.29 GB"
    assert values["lg-lora-13b"] == 38_120_000_000           # LitGPT: max_memory_allocated() / 1e9, "38.12 GB"
    assert values["hf-bert"] == 14949 * 1024**2              # NVML's used bytes // 1024**2, printed "MB"


def test_each_row_names_the_measure_it_matches():
    measures = {row.id: row.measure for row in PUBLISHED}
    assert measures["tt-lora"] == "reserved (whole run)"
    assert measures["tt-qlora-load"] == "reserved (after loading)"
    assert measures["lg-qlora"] == "allocated (whole run)"
    assert measures["hf-bert"] == "nvidia-smi (whole run)"
    assert len({row.id for row in PUBLISHED}) == len(PUBLISHED)


def test_every_row_has_a_source_line_and_a_setup():
    for row in PUBLISHED:
        path, _, line = row.file.rpartition(":")
        assert path and int(line) > 0 and "@" in row.source and row.url.startswith("https://github.com/")
        assert row.source.split("@")[1][:7] in row.url and len(row.setup) > 40


def test_the_error_is_predicted_less_measured_over_measured():
    for row in compare():
        assert row["error"] == Fraction(row["predicted"] - row["measured"], row["measured"])
        assert row["predicted"] > 0


def test_a_row_not_computed_with_its_own_measure_says_why():
    rows = {row["id"]: row for row in compare()}
    assert rows["tt-lora"]["computed"] == "reserved (step)" and "loading" in rows["tt-lora"]["missing"]
    assert rows["lg-lora"]["computed"] == "allocated (step)"
    assert "loading" in rows["tt-qlora-load"]["missing"]
    assert "nvidia-smi" in rows["hf-bert"]["missing"]
    # the QLoRA step holds the NF4 model and the step's tensors, so it is above the model after loading
    assert rows["tt-qlora"]["predicted"] > rows["tt-qlora-load"]["predicted"]
    # the BERT-large reading after loading: its FP32 weights (335,141,888 parameters) and the 1343 MiB context
    assert rows["hf-bert-load"]["predicted"] == 4 * 335_141_888 + 1343 * MiB
