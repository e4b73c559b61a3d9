"""``memledger.measure.HFCallback`` under Hugging Face's ``Trainer`` on the CPU: a two-layer LlamaForCausalLM
(hidden 64) trained three steps on random tokens. transformers' model keeps tensors memledger does not book
(another issue), so the numbers are not expected to agree: the report must be whole, the difference reported, and
what the report measured must be PyTorch's count of the run (the gradients are the parameters' size)."""
import json

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch                                                              # noqa: E402

from memledger import Architecture                                        # noqa: E402
from memledger.measure import HFCallback                                  # noqa: E402
from memledger.measure.report import PARTS                                # noqa: E402
from memledger.step.timeline import LANDMARKS                             # noqa: E402

pytestmark = pytest.mark.slow

B, S, V = 2, 32, 1000


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.randint(0, V, (S,))
        return {"input_ids": ids, "labels": ids.clone()}


def test_hf_trainer_writes_the_report_and_the_plot(tmp_path, capsys):
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=S)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=B,
                                          max_steps=3, use_cpu=True, report_to=[], save_strategy="no",
                                          logging_strategy="no", disable_tqdm=True)
    callback = HFCallback(setup=dict(arch=Architecture(64, 2, 4, 160, V, "llama"), recipe="fp32-adamw"), steps=2,
                          report=tmp_path / "memledger.json")
    transformers.Trainer(model=model, args=args, train_dataset=RandomTokens(), callbacks=[callback]).train()

    report = json.loads((tmp_path / "memledger.json").read_text())
    measured, predicted, difference = report["measured"], report["predicted"], report["difference"]
    assert [s["label"] for s in measured["steps"]] == ["global step 1", "global step 2"]
    assert measured["compared_step"] == 2 and measured["what"] == "MemTracker"
    assert set(measured["landmarks"]) == set(predicted["landmarks"]) == set(LANDMARKS)
    assert set(measured["phase_peaks"]) == set(predicted["phase_peaks"]) == {"forward", "backward", "optimizer"}
    assert report["observed"]["batch"] == [B, S]                  # the batch shape came from the run
    assert report["setup"]["batch_size"] == B and report["setup"]["seq_len"] == S
    params = sum(p.numel() for p in model.parameters())
    assert report["observed"]["parameters"] == params == predicted["n_params"]
    # the Trainer's default optimizer on torch >= 2.8 is AdamW(fused=True), read off the optimizer
    assert report["observed"]["optimizer_conventions"] == {"fused": True, "foreach": False}
    assert predicted["conventions"] == {"fused": True, "foreach": False}
    # MemTracker's count of the run: after backward the step holds the FP32 gradients, 4 bytes per parameter
    assert measured["landmarks"]["after backward"] - measured["landmarks"]["before forward"] == 4 * params
    assert measured["peak"] == max(measured["phase_peaks"].values())
    # the difference, reported whatever it is
    assert difference["bytes"] == measured["peak"] - predicted["peak"]
    assert [p["part"] for p in difference["parts"]] == list(PARTS)
    largest = difference["largest_unexplained"]
    assert largest is None or abs(largest["bytes"]) == max(abs(p["bytes"]) for p in difference["parts"])
    assert report["environment"]["libraries"]["transformers"] == transformers.__version__
    assert callback.line == report["line"] and report["line"] in capsys.readouterr().out
    assert (tmp_path / "memledger.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
