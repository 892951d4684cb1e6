"""Ranks of a real torch.distributed job (gloo, 2 processes) get disjoint samples, equal counts;
the rank split (pad / drop / once) matches DistributedSampler and is independent of the batch-level
drop_last; set_epoch picks the epoch's order."""

import textwrap

import pytest

from helpers import run_ranks

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {src!r})
    import torch.distributed as dist
    import stoker

    dist.init_process_group("gloo", rank=int(sys.argv[2]), world_size=2,
                            init_method="tcp://127.0.0.1:" + sys.argv[3])
    import numpy as np
    from torch.utils.data import DistributedSampler

    with stoker.Loader(sys.argv[1], batch_size=5, image_size=16, workers=0) as loader:
        order = loader.recipe.plan.order(0)
        out = {{"rank": loader.recipe.plan.rank, "world": loader.recipe.plan.world_size,
               "batches": len(loader), "samples": order.tolist()}}
    images, ids = np.zeros((37, 4, 4, 3), np.uint8), np.arange(37)  # label = sample id
    for split in ("pad", "drop", "once"):
        with stoker.Loader(images, labels=ids, batch_size=4, workers=0, shuffle=True,
                           drop_last=True, rank_split=split) as loader:
            out[split] = {{"per_rank": loader.recipe.plan.per_rank(), "batches": len(loader),
                          "got": [int(v) for _, y in loader for v in y]}}
        sampler = DistributedSampler(range(37), drop_last=split == "drop", shuffle=False)
        out[split]["sampler"] = len(sampler)
    with stoker.Loader(images, labels=ids, batch_size=4, workers=0, shuffle=False,
                       rank_split="once") as loader:  # evaluation: every sample once
        out["eval"] = [int(v) for _, y in loader for v in y]
    with stoker.Loader(images, labels=ids, batch_size=4, workers=0, seed=1) as loader:
        loader.set_epoch(3)
        out["epoch3"] = [int(v) for _, y in loader for v in y]
        out["epoch3_order"] = loader.recipe.plan.order(3)[: len(out["epoch3"])].tolist()
        out["after"] = loader.state_dict()["epoch"]
    print("RESULT " + json.dumps(out))
    dist.destroy_process_group()
    """
)


EARLY = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {src!r})
    import numpy as np
    import torch.distributed as dist
    import stoker

    class Numbers:  # a per-sample dataset: its worker is launched at construction
        def __len__(self):
            return 37
        def __getitem__(self, i):
            return np.full(2, i, np.float32), i

    folder, fields = sys.argv[1], ("image", "label", "index")
    # made before the process group exists, as in Lightning's LightningModule.__init__
    early = stoker.Loader(folder, batch_size=5, image_size=16, workers=0, batch=fields)
    ahead = stoker.Loader(Numbers(), batch_size=4, workers=1, shuffle=False)
    used = stoker.Loader(folder, batch_size=5, image_size=16, workers=0)
    out = {{"before": len(early), "used": len(next(iter(used))[1])}}
    dist.init_process_group("gloo", rank=int(sys.argv[2]), world_size=2,
                            init_method="tcp://127.0.0.1:" + sys.argv[3])
    plan = early.recipe.plan
    out["after"], out["rank"], out["world"] = len(early), plan.rank, plan.world_size
    out["early"] = [[int(i) for i in index] for _, _, index in early]
    with stoker.Loader(folder, batch_size=5, image_size=16, workers=0, batch=fields) as late:
        out["late"] = [[int(i) for i in index] for _, _, index in late]
    out["ahead"] = [int(v) for _, y in ahead for v in y]
    try:
        next(iter(used))
    except stoker.ConfigError as exc:
        out["error"] = str(exc)
    for loader in (early, ahead, used):
        loader.close()
    print("RESULT " + json.dumps(out))
    dist.destroy_process_group()
    """
)


JAX = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {src!r})
    import numpy as np
    import jax
    import stoker

    images, ids = np.zeros((10, 4, 4, 3), np.uint8), np.arange(10)
    early = stoker.Loader(images, labels=ids, batch_size=2, workers=0, shuffle=False)
    out = {{"before": len(early)}}  # jax imported, not initialised: its backend is left alone
    jax.distributed.initialize("127.0.0.1:" + sys.argv[2], num_processes=2,
                               process_id=int(sys.argv[1]))
    out["after"], out["rank"] = len(early), early.recipe.plan.rank
    out["got"] = [int(v) for _, y in early for v in y]
    early.close()
    print("RESULT " + json.dumps(out))
    jax.distributed.shutdown()
    """
)


@pytest.mark.timeout(300)
def test_rank_and_world_size_come_from_torch_distributed(tmp_path, image_folder):
    pytest.importorskip("torch.distributed")
    outs = run_ranks(tmp_path, SCRIPT, str(image_folder))
    assert sorted(o["rank"] for o in outs) == [0, 1] and {o["world"] for o in outs} == {2}
    assert outs[0]["batches"] == outs[1]["batches"] == 3  # 36 samples / 2 ranks, batches of 5
    assert not set(outs[0]["samples"]) & set(outs[1]["samples"])
    for o in outs:  # 37 samples, 2 ranks, batches of 4 with drop_last=True
        assert o["pad"]["per_rank"] == o["pad"]["sampler"] == 19  # DistributedSampler's count
        assert o["drop"]["per_rank"] == o["drop"]["sampler"] == 18
        assert o["pad"]["batches"] == o["drop"]["batches"] == 4  # the ragged batch dropped
        assert len(o["pad"]["got"]) == len(o["drop"]["got"]) == 16
        assert o["epoch3"] == o["epoch3_order"] and o["after"] == 4
    assert {len(o["once"]["got"]) for o in outs} == {16}  # 19 and 18 samples: 4 full batches
    assert not set(outs[0]["drop"]["got"]) & set(outs[1]["drop"]["got"])
    assert sorted(outs[0]["eval"] + outs[1]["eval"]) == list(range(37))  # each exactly once
    assert outs[0]["epoch3"] != outs[0]["pad"]["got"]


@pytest.mark.timeout(300)
def test_a_loader_made_before_init_process_group_takes_the_groups_split(tmp_path, image_folder):
    pytest.importorskip("torch.distributed")
    outs = run_ranks(tmp_path, EARLY, str(image_folder))
    assert sorted(o["rank"] for o in outs) == [0, 1] and {o["world"] for o in outs} == {2}
    for o in outs:
        assert o["before"] == 7 and o["after"] == 3  # 36 samples, full batches of 5: 7 alone
        assert o["early"] == o["late"]  # exactly the split of a loader made after the group
        assert len(o["early"]) == o["after"]
    split = [sorted(i for batch in o["early"] for i in batch) for o in outs]
    assert not set(split[0]) & set(split[1]) and len(split[0]) == len(split[1]) == 15
    assert sorted(outs[0]["ahead"] + outs[1]["ahead"]) == sorted([*range(37), 0])  # pad: 19 each
    assert not set(outs[0]["ahead"]) & set(outs[1]["ahead"][:-1])  # rank 1's last wraps round
    for o in outs:  # a loader that started as rank 0 of 1 refuses, naming the fix
        assert o["used"] == 5
        assert "handed out batches as rank 0 of 1" in o["error"]
        assert "init_process_group" in o["error"] and "rank=" in o["error"]


@pytest.mark.needs("jax")
@pytest.mark.timeout(300)
def test_a_loader_made_before_jax_distributed_initialize_takes_its_split(tmp_path):
    outs = run_ranks(tmp_path, JAX)
    assert [o["rank"] for o in outs] == [0, 1]
    assert [o["before"] for o in outs] == [5, 5] and [o["after"] for o in outs] == [3, 3]
    assert outs[0]["got"] == [0, 2, 4, 6, 8] and outs[1]["got"] == [1, 3, 5, 7, 9]
