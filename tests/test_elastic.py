"""The position is global: a state saved on any rank resumes on any number of ranks. With the
global batch (batch_size x world_size) unchanged every later global batch is the uninterrupted
run's, byte for byte (augment="train", a batch_transform, a bad file); with another one, the
rest of the epoch is the samples not yet consumed, each once, in the same order."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import stoker
from helpers import SRC, free_port, global_steps, script_result

FIELDS = ("image", "label", "index")


def shift(batch, rng):
    """A batch transform whose effect on a sample depends on that sample and the draws only."""
    batch["image"] ^= np.uint8(rng.integers(0, 256))
    return {"label": batch["label"].astype(np.float32) + np.float32(rng.random())}


def _kw(**extra):
    kw = dict(image_size=16, augment="train", seed=5, workers=0, batch=FIELDS)
    return {**kw, **extra}


def _ranks(source, world, batch_size, **extra):
    return [
        stoker.Loader(source, rank=r, world_size=world, batch_size=batch_size, **_kw(**extra))
        for r in range(world)
    ]


def _close(loaders):
    for loader in loaders:
        loader.close()


@pytest.fixture
def bad_folder(image_folder, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(image_folder, folder)
    victim = sorted(folder.glob("*/*.jpg"))[5]
    victim.write_bytes(victim.read_bytes()[:60])
    return folder


@pytest.mark.timeout(120)
def test_4_and_2_ranks_give_the_same_global_batches_and_resume_into_each_other(bad_folder):
    """4 x 4 and 2 x 8: each global step holds the same samples at the same global positions,
    the same pixels; a state saved on rank 2 of 4 resumes 2 ranks at the next step."""
    kw = dict(batch_transform=shift, max_errors=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bad file is warned about on every pass
        four = _ranks(bad_folder, 4, 4, **kw)
        whole = global_steps(four) + global_steps(four)  # two epochs
        two = _ranks(bad_folder, 2, 8, **kw)
        assert global_steps(two) + global_steps(two) == whole
        _close(two)
        four = _ranks(bad_folder, 4, 4, **kw)
        first = global_steps(four, 1)
        states = [loader.state_dict() for loader in four]
        assert all(s == states[0] for s in states)  # the same dict on every rank
        assert states[0]["samples"] == 16 and states[0]["position"] == 1
        assert json.loads(json.dumps(states[2])) == states[2]
        two = _ranks(bad_folder, 2, 8, **kw)
        for loader in two:
            loader.load_state_dict(states[2])
        rest = global_steps(two) + global_steps(two)
    assert first + rest == whole
    replaced = [v for step in whole[:3] for p, v in step.items() if v[0] != _at(four[0], p)]
    assert replaced  # the bad file was met and replaced (by the next sample in global order)
    assert "world_size 4 -> 2" in two[0].resume_note and "unchanged" in two[0].resume_note
    _close(four + two)


def _at(loader, p):
    """The source index at global position ``p`` of epoch 0's order."""
    order = loader.recipe.plan.global_order(0)
    return int(loader.recipe.source.source_indices(order[p % len(order)].reshape(1))[0])


@pytest.mark.timeout(120)
def test_another_global_batch_gives_the_rest_of_the_epoch_each_once(image_folder):
    """4 x 4 saved after one step, resumed on 2 x 5: the rest of epoch 0 is the 20 samples
    not yet consumed, each once, in global order; epoch 1 is a 2 x 5 run's; a warning names
    what changed."""
    four = _ranks(image_folder, 4, 4)
    global_steps(four, 1)
    state = four[1].state_dict()
    two = _ranks(image_folder, 2, 5)
    with pytest.warns(UserWarning, match=r"world_size 4 -> 2, batch_size 4 -> 5: 16 -> 10"):
        for loader in two:
            loader.load_state_dict(state)
    assert [len(loader) for loader in two] == [2, 2]  # 20 samples: 10 a rank
    rest = global_steps(two)
    got = [v[0] for step in rest for _, v in sorted(step.items())]
    order = two[0].recipe.plan.global_order(0)
    assert got == two[0].recipe.source.source_indices(order[16:]).tolist()
    fresh = _ranks(image_folder, 2, 5)
    for loader in fresh:
        loader.set_epoch(1)
    assert global_steps(two) == global_steps(fresh)
    assert "global sample 16 (step 1) of epoch 0 on 2 ranks" in two[0].resume_note
    _close(four + two + fresh)


@pytest.mark.timeout(60)
def test_a_state_in_a_resumed_epoch_resumes_it_again_and_advances(image_folder):
    """A state saved inside the rest of an epoch (resumed with another global batch) keeps
    its start: the same sizes resume at the same step; advance_state counts its steps."""
    (one,) = _ranks(image_folder, 1, 4)
    global_steps([one], 3)  # 12 samples
    (other,) = _ranks(image_folder, 1, 5)
    with pytest.warns(UserWarning, match="another global batch"):
        other.load_state_dict(one.state_dict())
    global_steps([other], 2)
    state = other.state_dict()
    assert (state["position"], state["samples"], state["resumed"]) == (5, 22, [0, 12, 3])
    (again,) = _ranks(image_folder, 1, 5)
    again.load_state_dict(state)
    assert global_steps([again]) == global_steps([other])
    ahead = again.advance_state(state, 2)  # 14 samples left: 2 full batches of 5 end it
    assert (ahead["epoch"], ahead["position"], ahead["samples"]) == (1, 0, 0)
    assert again.advance_state(state, 1)["samples"] == 27
    assert again.advance_state(state, 3)["samples"] == 5  # a step into epoch 1
    _close([one, other, again])


@pytest.mark.timeout(60)
def test_a_state_of_the_earlier_format_still_loads(image_folder):
    """Version 1: a position in this rank's batches, with batch_size and batches to match."""
    (loader,) = _ranks(image_folder, 1, 4)
    old = {
        "version": 1,
        "epoch": 1,
        "position": 2,
        "seed": 5,
        "batch_size": 4,
        "batches": 9,
        "fingerprint": loader.recipe.source.fingerprint(),
    }
    loader.load_state_dict(old)
    state = loader.state_dict()
    assert (state["epoch"], state["position"], state["samples"]) == (1, 2, 8)
    (fresh,) = _ranks(image_folder, 1, 4)
    fresh.set_epoch(1)
    assert global_steps([loader]) == global_steps([fresh])[2:]
    with pytest.raises(stoker.ConfigError, match="different batch_size"):
        loader.load_state_dict({**old, "batch_size": 8})
    _close([loader, fresh])


RANK = textwrap.dedent(
    """
    import datetime, hashlib, json, pathlib, sys, warnings
    sys.path.insert(0, {src!r})
    import torch.distributed as dist
    import stoker

    folder, out, me = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
    ports = sys.argv[4:7]
    # (world size, batch size, workers, steps to take: None = to the end of epoch 1)
    PHASES = [(4, 2, 0, 1), (2, 4, 2, 2), (3, 3, 0, None)]
    report = []
    for phase, (world, size, workers, steps) in enumerate(PHASES):
        if me >= world:
            continue
        dist.init_process_group("gloo", rank=me, world_size=world, timeout=datetime.timedelta(
            seconds=300), init_method="tcp://127.0.0.1:" + ports[phase])
        # every rank joins only once the phase before saved its state: it is on disk
        loader = stoker.Loader(folder, batch_size=size, image_size=16, augment="train",
                               seed=5, workers=workers, batch=("image", "index"), drop_last=False)
        assert (loader.recipe.plan.rank, loader.recipe.plan.world_size) == (me, world)
        if phase:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loader.load_state_dict(json.loads((out / f"state{{phase - 1}}.json").read_text()))
        taken = []
        for _ in range(steps) if steps else iter(int, 1):
            epoch, k = loader._received()
            if epoch == 2:
                break
            images, index = next(iter(loader))
            slots = loader.recipe.plan.slots(epoch)[k * size : k * size + len(index)]
            taken.append([epoch, loader.recipe.plan.first_step(epoch) + k, [
                [int(p), int(i), hashlib.sha1(img.tobytes()).hexdigest()]
                for p, i, img in zip(slots, index, images, strict=True)]])
        state = loader.state_dict()
        gathered = [None] * world
        dist.all_gather_object(gathered, state)
        if me == 0:
            (out / f"state{{phase}}.json").write_text(json.dumps(state))
        report.append({{"phase": phase, "taken": taken, "same": all(s == state for s in gathered),
                       "note": loader.resume_note}})
        loader.close()
        dist.barrier()  # the state is written before anyone leaves the group
        dist.destroy_process_group()
    print("RESULT " + json.dumps(report))
    """
)


@pytest.mark.timeout(420)
def test_torch_distributed_4_then_2_then_3_ranks_lose_nothing_and_repeat_nothing(
    image_folder, tmp_path
):
    """Real gloo groups, processes spawned once: 4 ranks x 2 (workers=0) take a step and save;
    2 ranks x 4 (workers=2) resume at step 1, take 2 steps and save; 3 ranks x 3 resume with
    another global batch and finish epochs 0 and 1. Each epoch's samples are the epoch, each
    once; the steps of 4 and 2 ranks are an uninterrupted 4-rank run's, pixels included."""
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(src=SRC))
    ports = [str(free_port()) for _ in range(3)]
    env = {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(image_folder), str(tmp_path), str(r), *ports],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for r in range(4)
    ]
    reports = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=400)  # four torch imports on a loaded machine
        assert p.returncode == 0, f"rank {r}:\n{err[-3000:]}"
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        reports.append(json.loads(line[len("RESULT ") :]))
    phases = {}
    for rep in reports:
        for ph in rep:
            assert ph["same"]  # every rank's state is the same dict
            phases.setdefault(ph["phase"], []).append(ph)
    assert [len(phases[k]) for k in range(3)] == [4, 2, 3]
    by_epoch: dict[int, list[int]] = {0: [], 1: []}
    steps: dict[tuple[int, int], dict[int, list]] = {}
    for k in range(3):
        for ph in phases[k]:
            for epoch, step, samples in ph["taken"]:
                by_epoch[epoch] += [i for _, i, _ in samples]
                if k < 2:
                    steps.setdefault((epoch, step), {}).update({p: [i, h] for p, i, h in samples})
    for epoch in (0, 1):
        assert sorted(by_epoch[epoch]) == list(range(36))  # nothing lost, nothing twice
    assert sorted(steps) == [(0, 0), (0, 1), (0, 2)]
    four = [
        stoker.Loader(
            image_folder,
            rank=r,
            world_size=4,
            batch_size=2,
            image_size=16,
            augment="train",
            seed=5,
            workers=0,
            batch=("image", "index"),
            drop_last=False,
        )
        for r in range(4)
    ]
    for step in range(3):
        want = {}
        for loader in four:
            images, index = loader.peek(step)
            slots = loader.recipe.plan.slots(0)[step * 2 : step * 2 + 2]
            for p, i, img in zip(slots, index, images, strict=True):
                want[int(p)] = [int(i), hashlib.sha1(img.tobytes()).hexdigest()]
        assert steps[(0, step)] == want
    assert "world_size 2 -> 3" in phases[2][0]["note"]
    _close(four)


@pytest.mark.timeout(120)
def test_batch_at_is_the_batch_training_received_in_any_epoch_and_on_any_rank(bad_folder):
    """augment="train", a batch_transform and a bad file: batch_at(epoch, step) of rank 0's
    loader is, byte for byte, what rank 0 and rank 1 received, in epoch 0 and epoch 2."""
    kw = dict(batch_transform=shift, max_errors=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        two = _ranks(bad_folder, 2, 5, **kw)
        got = {}
        for epoch in range(3):
            for loader in two:
                loader.set_epoch(epoch)
                for step, batch in enumerate(loader):
                    got[(epoch, step, loader.recipe.plan.rank)] = batch
        (look,) = [stoker.Loader(bad_folder, rank=0, world_size=2, batch_size=5, **_kw(**kw))]
        for epoch, step, rank in [(0, 0, 0), (0, 2, 1), (2, 1, 0), (2, 2, 1)]:
            again = look.batch_at(epoch, step, rank=None if rank == 0 else rank)
            for a, b in zip(again, got[(epoch, step, rank)], strict=True):
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert sum(loader.stats().skipped for loader in two) >= 1  # the bad file was met
    assert look.state_dict()["position"] == 0  # nothing moved
    with pytest.raises(stoker.ConfigError, match="past its end"):
        look.batch_at(0, 99)
    _close([*two, look])


@pytest.mark.timeout(60)
def test_samples_at_names_a_steps_samples_without_opening_a_file(image_folder, tmp_path):
    """The whole global batch or one rank's part, as the training batches' index and path;
    the files removed afterwards: nothing is opened."""
    folder = tmp_path / "copy"
    shutil.copytree(image_folder, folder)
    two = _ranks(folder, 2, 4, batch=("image", "index", "path"))
    taken = [[next(iter(loader)) for loader in two] for _ in range(2)]
    for path in folder.glob("*/*.jpg"):
        path.unlink()
    for step, parts in enumerate(taken):
        whole = two[0].samples_at(0, step)
        for rank, (_, index, paths) in enumerate(parts):
            mine = two[1].samples_at(0, step, rank=rank)
            assert mine["index"] == index.tolist() and mine["path"] == list(paths)
            assert mine["rank"] == [rank] * 4
            assert [i for i, r in zip(whole["index"], whole["rank"], strict=True) if r == rank] == (
                index.tolist()
            )
        assert whole["position"] == list(range(8 * step, 8 * step + 8))
    assert json.loads(json.dumps(whole)) == whole
    with pytest.raises(stoker.ConfigError, match="rank=5"):
        two[0].samples_at(0, 0, rank=5)
    _close(two)


@pytest.mark.timeout(60)
def test_skipped_steps_stay_skipped_after_a_resume_and_the_rest_are_unchanged(image_folder):
    """skip= leaves global steps 2 and 3 of epoch 0 out; the other batches are the unskipped
    run's; a state saved after step 1 keeps the skip in a loader made without it."""
    (plain,) = _ranks(image_folder, 1, 4)
    everything = [b[2].tolist() for b in plain]
    (skipping,) = _ranks(image_folder, 1, 4)
    skipping.skip(0, (2, 4))
    assert len(skipping) == len(plain) - 2
    it = iter(skipping)
    first = [next(it)[2].tolist() for _ in range(2)]
    state = skipping.state_dict()
    assert state["skip"] == [[0, 2, 4]] and (state["position"], state["samples"]) == (4, 16)
    (restarted,) = _ranks(image_folder, 1, 4)
    restarted.load_state_dict(json.loads(json.dumps(state)))
    rest = [b[2].tolist() for b in restarted]
    assert first + rest == everything[:2] + everything[4:]
    assert restarted.skipped == {0: [(2, 4)]}
    assert restarted.batch_at(0, 2)[2].tolist() == everything[2]  # still addressable
    after = skipping.advance_state(state, 1)
    assert (after["position"], after["samples"]) == (5, 20)
    with pytest.raises(stoker.ConfigError, match="skip="):
        restarted.skip(0, (4, 2))
    _close([plain, skipping, restarted])


KERAS = textwrap.dedent(
    """
    import json, sys, warnings
    import keras, numpy as np, stoker

    def model():
        m = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
        m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    folder, ckpt = sys.argv[1], sys.argv[2]
    kw = dict(image_size=16, workers=0, seed=3, drop_last=False)
    with stoker.Loader(folder, batch_size=4, **kw) as first:  # 3 steps trained, then stopped
        cb = first.keras_checkpoint(ckpt, save_freq=3)
        model().fit(first.keras(), epochs=1, steps_per_epoch=3, callbacks=[cb], verbose=0)
    with stoker.Loader(folder, batch_size=6, **kw) as again, warnings.catch_warnings(
            record=True) as said:  # restarted with another batch_size
        warnings.simplefilter("always")
        cb = again.keras_checkpoint(ckpt)
        steps = len(again)
        rest = [i for s in range(3, 3 + steps) for i in again.samples_at(0, s)["index"]]
        history = model().fit(again.keras(), epochs=1, callbacks=[cb], verbose=0).history
        order = again.recipe.source.source_indices(again.recipe.plan.global_order(0)).tolist()
        print("RESULT " + json.dumps({"steps": steps, "rest": rest, "order": order,
              "loss": history["loss"], "after": again.state_dict(), "note": cb.note,
              "warned": [str(w.message) for w in said], "stats": str(again.stats())}))
    """
)


@pytest.mark.needs("keras")
@pytest.mark.timeout(240)
def test_keras_fit_resumes_from_keras_checkpoint_with_another_batch_size(image_folder, tmp_path):
    """Saved after 3 steps of 4 (12 samples); fit resumed with batch_size=6 trains the 24
    samples not yet consumed, in 4 steps, and says so (warning, print, stats())."""
    script = tmp_path / "keras_resume.py"
    script.write_text(KERAS)
    ckpt = str(tmp_path / "ckpt" / "loader.json")
    out, stdout = script_result(
        script, str(image_folder), ckpt, timeout=210, KERAS_BACKEND="torch", CUDA_VISIBLE_DEVICES=""
    )
    assert out["steps"] == 4 and len(out["loss"]) == 1
    assert out["rest"] == out["order"][12:]  # each sample not yet consumed, once, in order
    assert (out["after"]["epoch"], out["after"]["position"]) == (1, 0)
    assert "batch_size 4 -> 6" in out["note"] and "stoker: resumed at global sample 12" in stdout
    assert any("4 -> 6: 4 -> 6 samples a step" in w for w in out["warned"])
    assert "resumed at global sample 12 (step 3) of epoch 0" in out["stats"]


@pytest.mark.timeout(120)
def test_a_torch_distributed_checkpoint_carries_a_resumed_and_skipping_state(
    image_folder, tmp_path
):
    """The torch view is a Stateful: dcp.save / dcp.load restore every key of the state, the
    resumed epoch's start and the skips included (dcp loads into the template's keys)."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    (four,) = _ranks(image_folder, 1, 4)
    global_steps([four], 3)
    (five,) = _ranks(image_folder, 1, 5)
    with pytest.warns(UserWarning, match="another global batch"):
        five.load_state_dict(four.state_dict())
    five.skip(0, (5, 6))
    global_steps([five], 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp without a process group says so
        dcp.save({"loader": five.torch()}, checkpoint_id=str(tmp_path / "ckpt"))
        (fresh,) = _ranks(image_folder, 1, 5)
        dcp.load({"loader": fresh.torch()}, checkpoint_id=str(tmp_path / "ckpt"))
    assert fresh.state_dict() == five.state_dict()
    assert fresh.state_dict()["resumed"] == [0, 12, 3]
    assert global_steps([fresh]) == global_steps([five])
    _close([four, five, fresh])


@pytest.mark.timeout(60)
def test_excluded_samples_leave_the_next_epoch_and_the_rest_keep_their_order(image_folder):
    """exclude() mid-epoch: the epoch under way is unchanged; the next one is the same
    permutation with the two samples taken out; a restart from the state keeps them out."""
    (plain,) = _ranks(image_folder, 1, 4, drop_last=False)
    epochs = [[i for b in plain for i in b[2].tolist()] for _ in range(2)]
    (loader,) = _ranks(image_folder, 1, 4, drop_last=False)
    it = iter(loader)
    first = [i for _ in range(2) for i in next(it)[2].tolist()]
    gone = [epochs[1][5], loader.file_paths[epochs[1][9]]]  # by index and by path
    loader.exclude(gone)
    assert loader.excluded == {1: sorted([epochs[1][5], epochs[1][9]])}
    rest = [i for b in it for i in b[2].tolist()]
    assert first + rest == epochs[0]
    state = loader.state_dict()
    assert state["exclude"] == [[1, sorted([epochs[1][5], epochs[1][9]])]]
    (restarted,) = _ranks(image_folder, 1, 4, drop_last=False)
    restarted.load_state_dict(json.loads(json.dumps(state)))
    assert len(restarted) == 9  # 34 samples in batches of 4
    after = [i for b in restarted for i in b[2].tolist()]
    assert after == [i for k, i in enumerate(epochs[1]) if k not in (5, 9)]
    assert restarted.samples_at(1, 1)["index"] == after[4:8]
    (fresh,) = _ranks(image_folder, 1, 4, drop_last=False)
    fresh.exclude([epochs[0][0]])  # at an epoch's start: from this epoch
    assert [i for b in fresh for i in b[2].tolist()] == epochs[0][1:]
    with pytest.raises(stoker.ConfigError, match="no sample is named"):
        fresh.exclude(["nowhere.jpg"])
    _close([plain, loader, restarted, fresh])


@pytest.mark.timeout(60)
def test_skip_and_exclude_options_are_the_methods(image_folder):
    """skip= and exclude= at construction do what skip() and exclude() do from epoch 0; a
    wrong value is refused with the form to use."""
    (plain,) = _ranks(image_folder, 1, 4, drop_last=False)
    epoch = [b[2].tolist() for b in plain]
    (made,) = _ranks(image_folder, 1, 4, drop_last=False, skip={0: [(1, 3)]})
    assert [b[2].tolist() for b in made] == epoch[:1] + epoch[3:]
    gone = epoch[0][0]
    (out,) = _ranks(image_folder, 1, 4, drop_last=False, exclude=[gone])
    assert [i for b in out for i in b[2].tolist()] == [i for b in epoch for i in b][1:]
    with pytest.raises(stoker.ConfigError, match=r"skip=\{3: \[\(1200, 1250\)\]\}"):
        stoker.Loader(image_folder, skip={0: "all"})
    with pytest.raises(stoker.ConfigError, match="exclude="):
        stoker.Loader(image_folder, exclude=7)
    _close([plain, made, out])


@pytest.mark.needs("jax")
@pytest.mark.timeout(120)
def test_a_jax_views_state_resumes_on_another_world_size(image_folder):
    """The JAX view carries the global state: 2 ranks x 4 take 2 steps through jax(), rank 1's
    view's state resumes a 1 x 8 view at global step 2, byte for byte the uninterrupted 1 x 8
    run's batches (the same global batch)."""

    def batches(view):
        return [tuple(np.asarray(a).tobytes() for a in b) for b in view]

    two = _ranks(image_folder, 2, 4)
    its = [iter(loader.jax()) for loader in two]
    for _ in range(2):
        for it in its:
            next(it)
    state = two[1].jax().state_dict()
    assert state["samples"] == 16 and state["position"] == 2
    whole = stoker.Loader(image_folder, rank=0, world_size=1, batch_size=8, **_kw())
    want = batches(whole.jax())
    one = stoker.Loader(image_folder, rank=0, world_size=1, batch_size=8, **_kw())
    view = one.jax()
    view.load_state_dict(state)
    got = batches(view)
    assert len(got) == 2 and got == want[2:]
    _close([*two, whole, one])
