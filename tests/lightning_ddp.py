"""A Lightning DDP run (2 CPU processes, gloo) over stoker views, for test_frameworks.py: data
built in ``__init__`` (before the process group exists) for a first fit stopped mid-epoch, in
``setup()`` for a second fit resumed from its checkpoint; ``val_dataloader()`` returns a view of
a ``rank_split="pad"`` loader, gathered with the padding dropped by ``index``. Each rank writes
what it saw to ``OUT/rank{r}.json``. Usage: ``python lightning_ddp.py FOLDER OUT``; then
``python lightning_ddp.py FOLDER OUT 8`` resumes that run's step-3 checkpoint on 1 device x
batch 8 (the same global batch), its data in a ``LightningDataModule``, and writes
``OUT/resumed.json``."""

import json
import sys
from pathlib import Path

import lightning as L
import numpy as np
import torch

import stoker

FOLDER, OUT = sys.argv[1], Path(sys.argv[2])
FIELDS = ("image", "label", "index")
TRAIN = {"batch_size": 4, "image_size": 16, "workers": 0, "seed": 1, "batch": FIELDS}
LATER_JOB = len(sys.argv) > 3  # 1 device, batch_size argv[3]
if LATER_JOB:
    TRAIN["batch_size"] = int(sys.argv[3])
VAL = {"batch_size": 5, "image_size": 16, "workers": 0, "augment": "eval", "shuffle": False}


# --8<-- [start:module]
def as_tensors(loader: stoker.Loader):
    return loader.torch(dtype=torch.float32, mean=0, std=1)


class Net(L.LightningModule):
    def __init__(self, data_in_init: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 3, 3))
        self.data_in_init, self.seen, self.scores, self.parts = data_in_init, [], [], []
        if data_in_init:  # before init_process_group: the loaders read the rank later
            self.make_data()

    def make_data(self) -> None:
        self.train_data = stoker.Loader(FOLDER, **TRAIN)
        self.val_data = stoker.Loader(FOLDER, rank_split="pad", batch=FIELDS, **VAL)

    def setup(self, stage: str) -> None:
        if not self.data_in_init:
            self.make_data()

    def train_dataloader(self):
        return as_tensors(self.train_data)

    def val_dataloader(self):
        return as_tensors(self.val_data)

    def training_step(self, batch, step):
        x, y, index = batch
        self.seen.append(index.tolist())
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def on_validation_epoch_start(self) -> None:
        self.parts = []

    def validation_step(self, batch, step):
        x, y, index = batch
        self.parts.append(torch.stack([index, (self.net(x).argmax(1) == y).long()], 1))

    def on_validation_epoch_end(self) -> None:
        # every rank's (index, correct); the padding repeats an index: keep each sample once
        gathered = self.all_gather(torch.cat(self.parts)).reshape(-1, 2).numpy()
        _, first = np.unique(gathered[:, 0], return_index=True)
        if self.trainer.sanity_checking:
            return
        with stoker.Loader(FOLDER, rank=0, world_size=1, **VAL) as whole, torch.no_grad():
            right = [(self.net(x).argmax(1) == y).sum().item() for x, y in as_tensors(whole)]
        self.scores.append(
            {"gathered": int(gathered[first, 1].sum()), "count": len(first), "whole": sum(right)}
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


# --8<-- [end:module]


def trainer(**kw) -> L.Trainer:
    return L.Trainer(
        strategy="ddp",
        devices=2,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


# --8<-- [start:datamodule]
class Data(L.LightningDataModule):
    """The loaders in a DataModule: nothing to save or load in it, Lightning keeps the
    train view's state_dict() in the checkpoint and restores it, as for the model's own."""

    def setup(self, stage: str) -> None:
        self.train_data = stoker.Loader(FOLDER, **TRAIN)
        self.val_data = stoker.Loader(FOLDER, rank_split="pad", batch=FIELDS, **VAL)

    def train_dataloader(self):
        return as_tensors(self.train_data)

    def val_dataloader(self):
        return as_tensors(self.val_data)


# --8<-- [end:datamodule]


class Later(Net):
    """The module of the later job: its data comes from ``Data``."""

    def setup(self, stage: str) -> None:
        pass


if LATER_JOB:  # the checkpoint 2 devices x 4 saved at step 3, resumed on 1 device x 8
    later, data = Later(data_in_init=False), Data()
    once = L.Trainer(
        devices=1,
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    once.fit(later, datamodule=data, ckpt_path=str(OUT / "epoch=0-step=3.ckpt"))
    with stoker.Loader(FOLDER, rank=0, world_size=1, **TRAIN) as alone:
        order = alone.recipe.source.source_indices(alone.recipe.plan.global_order(0)).tolist()
        alone.set_epoch(1)
        fresh = [[int(i) for i in b[2]] for b in alone]
    resumed = {"resumed": later.seen, "order": order, "epoch1": fresh}
    resumed["note"] = data.train_data.resume_note
    (OUT / "resumed.json").write_text(json.dumps(resumed))
    sys.exit(0)
# --8<-- [start:fit]
first = Net(data_in_init=True)
save = L.pytorch.callbacks.ModelCheckpoint(OUT, every_n_train_steps=3, save_top_k=-1)
run = trainer(max_steps=3, callbacks=[save])
run.fit(first)  # stops mid-epoch: 4 batches per rank per epoch
rank = run.global_rank
resumed = Net(data_in_init=False)
again = trainer(max_epochs=2, enable_checkpointing=False)
again.fit(resumed, ckpt_path=str(OUT / "epoch=0-step=3.ckpt"))
# --8<-- [end:fit]
with stoker.Loader(FOLDER, rank=rank, world_size=2, **TRAIN) as alone:
    expected = [[[int(i) for i in b[2]] for b in alone] for _ in range(2)]  # epochs 0 and 1
report = {
    "rank": rank,
    "first": first.seen,
    "resumed": resumed.seen,
    "expected": expected,
    "scores": resumed.scores,
    "len": len(first.train_data),
}
(OUT / f"rank{rank}.json").write_text(json.dumps(report))
