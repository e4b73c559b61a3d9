"""``memledger.measure.LightningCallback`` under Lightning's ``Trainer`` on the CPU, with memledger's reference
decoder as the LightningModule (skipped where Lightning is not installed: requirements.txt does not pin it).

Lightning runs ``training_step``, then ``zero_grad``, then ``backward`` in one closure
(``pytorch_lightning/loops/optimization/automatic.py``, ``Closure.closure``, l. 130-140 in 2.6.6): the gradients
of one step stay alive until the next step's forward has run. memledger's step frees them after the optimizer
step (``zero_grad(set_to_none=True)``), so the report must find exactly them, the FP32 gradients, 4 bytes per
parameter, held before forward and added to the forward phase's peak."""
import json

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

from memledger.measure import LightningCallback                          # noqa: E402
from memledger.pytorch.compare import architecture_of                     # noqa: E402
from memledger.pytorch.reference import RefConfig, make_model             # noqa: E402

pytestmark = pytest.mark.slow

C = RefConfig(64, 2, 4, 160, 1000, "llama")
B, S = 2, 32


class Reference(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.decoder = make_model(C, "fp32-adamw")

    def training_step(self, batch, index):
        ids, targets = batch
        return self.decoder.loss(ids, targets)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.randint(0, C.V, (S,)), torch.randint(0, C.V, (S,))


def test_lightning_keeps_the_last_steps_gradients_through_the_forward(tmp_path):
    torch.manual_seed(0)
    module = Reference()
    callback = LightningCallback(setup=dict(arch=architecture_of(C), recipe="fp32-adamw"), steps=2,
                                 report=tmp_path / "r.json", echo=False)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                         default_root_dir=tmp_path)
    trainer.fit(module, torch.utils.data.DataLoader(RandomTokens(), batch_size=B))
    report = json.loads((tmp_path / "r.json").read_text())
    measured, predicted = report["measured"], report["predicted"]
    params = sum(p.numel() for p in module.parameters())
    gradients = 4 * params
    assert report["observed"]["batch"] == [B, S] and measured["compared_step"] == 2
    # the first step starts with the FP32 parameters and the batch (ids and targets, int64), made before the
    # callback attached and counted from on_train_batch_start
    assert measured["steps"][0]["landmarks"]["before forward"] == 4 * params + 2 * B * S * 8
    assert measured["landmarks"]["before forward"] - predicted["landmarks"]["before forward"] == gradients
    assert measured["phase_peaks"]["forward"] - predicted["phase_peaks"]["forward"] == gradients
    assert measured["phase_peaks"]["backward"] == predicted["phase_peaks"]["backward"] + 4
    # (+4: Lightning's FP32 copy of the loss, ClosureResult.__post_init__: closure_loss.detach().clone(), l. 59)
    largest = report["difference"]["largest_unexplained"]
    assert largest["part"] == "held before forward" and largest["bytes"] == gradients
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
