"""The DataLoader parts of a Loader's torch view, read by the real frameworks in this process:
Lightning's shuffle check, Accelerate's ``skip_first_batches`` (a DataLoader rebuilt from the
view's parts gives exactly its batches from batch n), torchdata's and Lightning's state
protocol."""

from __future__ import annotations

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")

IMAGES, IDS = np.zeros((37, 4, 4, 3), np.uint8), np.arange(37)  # label = sample id


def _loader(**kw) -> stoker.Loader:
    return stoker.Loader(
        IMAGES, labels=IDS, batch_size=4, shuffle=True, drop_last=False, seed=3, **kw
    )


def _ids(batches) -> list[list[int]]:
    return [y.tolist() for _, y in batches]


@pytest.mark.needs("accelerate")
@pytest.mark.timeout(240)
def test_accelerate_skip_first_batches_gives_the_views_batches_from_batch_n():
    from accelerate import skip_first_batches

    with _loader(workers=0) as whole:
        epochs = [_ids(whole.torch()), _ids(whole.torch())]
    with _loader(workers=2) as loader:
        view = loader.torch()
        skipped = skip_first_batches(view, 3)
        assert isinstance(skipped, torch.utils.data.DataLoader)  # accelerate rebuilds one
        assert len(skipped) == len(view) - 3 == 7
        assert _ids(skipped) == epochs[0][3:]  # exactly batch 3 on, made by stoker's workers
        assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0
        first = next(iter(view))  # the view goes on with the next epoch
        assert first[1].tolist() == epochs[1][0]
        assert _ids(skip_first_batches(view, 8)) == epochs[1][8:]  # the same epoch, batch 8


@pytest.mark.needs("lightning")
@pytest.mark.timeout(120)
def test_lightning_reads_a_views_batch_sampler_and_state():
    from lightning.fabric.utilities.types import _Stateful
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled, sized_len

    with _loader(workers=0) as loader:
        view = loader.torch()
        assert _is_dataloader_shuffled(view) is False  # no AttributeError: batch_sampler
        assert isinstance(view, _Stateful) and sized_len(view) == len(loader) == 10
        sampler = view.batch_sampler
        assert len(sampler) == 10 and sampler.batch_size == 4 and sampler.sampler.shuffle
        refs = list(sampler)
        assert [len(r) for r in refs] == [4] * 9 + [1]
        assert sorted(i for r in refs for i in r) == list(range(37))
        assert refs[2] == _ids(view)[2]  # the batch sampler's indices are the batches' samples
        assert view.num_workers == 0 and view.prefetch_factor is None
        with pytest.raises(stoker.ConfigError, match="whole batches"):
            view.dataset.__getitems__([0, 1])


@pytest.mark.needs("torchdata")
@pytest.mark.timeout(120)
def test_a_dataloader_rebuilt_from_the_parts_resumes_with_torchdata_state():
    from torchdata.stateful_dataloader import Stateful

    with _loader(workers=0) as loader:
        view = loader.torch()
        assert isinstance(view, Stateful)
        batches = iter(view)
        expected = [next(batches)[1].tolist() for _ in range(4)]
        batches.close()
        state = view.state_dict()
        rebuilt = torch.utils.data.DataLoader(
            view.dataset, batch_sampler=view.batch_sampler, collate_fn=view.collate_fn
        )
        assert _ids(rebuilt)[:4] == expected  # a rebuilt DataLoader starts at the epoch's start
        view.load_state_dict(state)
        assert next(iter(view))[1].tolist() == _ids(rebuilt)[4]


@pytest.mark.needs("transformers")
@pytest.mark.timeout(300)
def test_hugging_face_trainer_resumes_a_view_exactly_through_skip_first_batches(
    tmp_path, image_folder
):
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.seen = torch.nn.Linear(16 * 16 * 3, 3), []

        def forward(self, pixel_values, labels, index):
            self.seen.append(index.tolist())
            logits = self.lin(pixel_values.flatten(1))
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    def train(resume: str | None) -> list[list[int]]:
        fields = {"pixel_values": "image", "labels": "label", "index": "index"}
        data = stoker.Loader(image_folder, batch_size=4, image_size=16, workers=0, batch=fields)

        class ViewTrainer(Trainer):
            def get_train_dataloader(self):
                return data.torch(dtype=torch.float32, mean=0, std=1)

        args = TrainingArguments(
            str(tmp_path), max_steps=12, save_steps=10, report_to=[], use_cpu=True
        )
        model = Tiny()
        with data:  # 9 batches an epoch: step 10 is batch 1 of epoch 1
            ViewTrainer(model=model, args=args, train_dataset=range(36)).train(resume)
        return model.seen

    unbroken = train(None)
    assert train(str(tmp_path / "checkpoint-10")) == unbroken[10:]  # exactly the next batches
