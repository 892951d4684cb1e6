"""An Accelerate run on 2 CPU processes (gloo) over stoker views, for test_frameworks.py: the
loaders are made before ``Accelerator()`` starts the process group; ``prepare`` passes the views
through, ``register_for_checkpointing`` + ``save_state``/``load_state`` resume exactly,
``skip_first_batches`` starts exactly n batches on, and ``gather_for_metrics`` over a
``rank_split="pad"`` view gives the single-process metric once the padding is dropped by
``index``. Each rank writes what it saw to ``OUT/rank{r}.json``.
Usage: ``python accelerate_ddp.py FOLDER OUT`` with RANK, WORLD_SIZE, MASTER_ADDR/PORT set;
then ``python accelerate_ddp.py FOLDER OUT BATCH_SIZE`` (one process, no group) resumes that
run's ``OUT/state`` with another world size and batch size and writes ``OUT/resumed{B}.json``:
the rest of epoch 0, each sample's index and image digest, and the epoch's global order."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

import stoker

FOLDER, OUT = sys.argv[1], Path(sys.argv[2])
FIELDS = ("image", "label", "index")
TRAIN = {"batch_size": 4, "image_size": 16, "workers": 1, "seed": 2, "batch": FIELDS}
VAL = {"batch_size": 5, "image_size": 16, "workers": 0, "augment": "eval", "shuffle": False}


def samples(batches) -> list[list[tuple[int, str]]]:
    """Each batch's samples as (source index, digest of the image's bytes)."""
    return [
        [
            (int(i), hashlib.sha1(x.numpy().tobytes()).hexdigest())
            for x, i in zip(xs, index, strict=True)
        ]
        for xs, _, index in batches
    ]


def indices(batches, count: int) -> list[list[int]]:
    out = []
    for _, _, index in batches:
        out.append(index.tolist())
        if len(out) == count:
            break
    return out


LATER_JOB = len(sys.argv) > 3  # the resume on one process, batch_size BATCH_SIZE
if LATER_JOB:
    TRAIN["batch_size"] = int(sys.argv[3])
# --8<-- [start:prepare]
train_data = stoker.Loader(FOLDER, **TRAIN)  # before the process group: the rank is read later
val_data = stoker.Loader(FOLDER, rank_split="pad", batch=FIELDS, **VAL)
accelerator = Accelerator(cpu=True)


def as_tensors(loader: stoker.Loader):  # prepare() leaves a view as it is: place it here
    return loader.torch(device=accelerator.device, dtype=torch.float32, mean=0, std=1)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 3, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train, val = as_tensors(train_data), as_tensors(val_data)
model, optimizer, prepared, prepared_val = accelerator.prepare(model, optimizer, train, val)
accelerator.register_for_checkpointing(train)
# --8<-- [end:prepare]
# --8<-- [start:resume]
if LATER_JOB:  # 1 process of batch_size 8 or 5: the state that 2 processes x 4 saved
    accelerator.load_state(str(OUT / "state"))  # any world size: the position is global
# --8<-- [end:resume]
if LATER_JOB:
    order = train_data.recipe.plan.global_order(0)
    resumed = {
        "rest": samples(train),  # the rest of epoch 0
        "order": train_data.recipe.source.source_indices(order).tolist(),
        "note": train_data.resume_note,
    }
    (OUT / f"resumed{sys.argv[3]}.json").write_text(json.dumps(resumed))
    train_data.close()
    val_data.close()
    accelerator.end_training()
    sys.exit(0)
report = {"rank": accelerator.process_index, "passed_through": prepared is train}
report["split"] = [train_data.recipe.plan.rank, train_data.recipe.plan.world_size, len(train)]

seen = []
for x, y, index in train:  # two steps, then a checkpoint, then what an unbroken run takes next
    seen.append(index.tolist())
    loss = torch.nn.functional.cross_entropy(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if len(seen) == 2:
        break
accelerator.save_state(str(OUT / "state"))
accelerator.wait_for_everyone()  # the main process writes the model: load only once it has
report["rest"] = samples(train)  # the rest of epoch 0 (2 more batches), with the pixels
report["unbroken"] = [[i for i, _ in b] for b in report["rest"]]
accelerator.load_state(str(OUT / "state"))
report["resumed"] = indices(train, 2)
report["seen"] = seen
# --8<-- [start:skip]
with stoker.Loader(FOLDER, **TRAIN) as fresh:  # a new job that skips the 2 batches trained
    report["skipped"] = indices(accelerator.skip_first_batches(as_tensors(fresh), 2), 2)
# --8<-- [end:skip]

# --8<-- [start:gather]
parts = []
with torch.no_grad():
    for x, y, index in val:
        parts.append(accelerator.gather_for_metrics(((model(x).argmax(1) == y).long(), index)))
correct = torch.cat([c for c, _ in parts]).numpy()
_, first = np.unique(torch.cat([i for _, i in parts]).numpy(), return_index=True)
report["gathered"], report["count"] = int(correct[first].sum()), len(first)
# --8<-- [end:gather]
with stoker.Loader(FOLDER, rank=0, world_size=1, **VAL) as whole, torch.no_grad():
    report["whole"] = sum(int((model(x).argmax(1) == y).sum()) for x, y in as_tensors(whole))
report["val_batches"] = len(val)
(OUT / f"rank{report['rank']}.json").write_text(json.dumps(report))
for loader in (train_data, val_data):
    loader.close()
accelerator.end_training()
