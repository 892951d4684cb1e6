"""Training loops: Keras fit, Keras' pad_to_aspect_ratio, overlap of loading and a step.

Cases (one per former script; `python benchmarks/training.py CASE --help` for each one's options):

    keras-fit    (was keras_fit.py) Input throughput through `loader.keras()` inside `model.fit` vs
                 plain iteration of the loader.
    keras-pad    (was keras_pad.py) ``pad_to_aspect_ratio=True`` against Keras'
                 ``image_dataset_from_directory`` itself, on the same JPEGs: how far stoker's pixels
                 are from Keras', and how much of that is the decoder.
    overlap      (was overlap.py) The user's scenario: does loading overlap with training? Epoch
                 time with a fake train step.
    elastic      Steps you can address: ``batch_at`` late in an epoch against one batch's
                 decode, ``samples_at``, and the first batch after a resume at a late position.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import common
import numpy as np
import peers

# ---------------------------------------------------------------------------- keras-fit

KERAS_FIT_DOC = """\
Input throughput through `loader.keras()` inside `model.fit` vs plain iteration of the loader.

TensorFlow backend (KERAS_BACKEND=tensorflow is set here). The model is so small that its
compute is negligible: uint8 input -> take every 16th pixel (14x14x3), cast, /255 ->
GlobalAveragePooling2D -> Dense(classes). So fit's images/s is the input path's images/s:
loader -> stoker's keras PyDataset -> Keras' data adapter (on TF: a tf.data generator) -> step.

    stoker numpy     `for x, y in loader` (continuous epochs), median epoch img/s
    stoker fit       `model.fit(loader.keras(), epochs=1 + N)`, epoch times from a callback;
                     the first epoch (tracing, worker start) is dropped
    keras numpy      the Keras PyDataset peer (peers.py: load_img + Pillow RandomResizedCrop,
                     workers=2, use_multiprocessing=True) through Keras' own adapter/enqueuer
    keras fit        the same PyDataset in model.fit
    model only       fit on one in-memory batch repeated (tf.data from_tensors.repeat): the
                     model's own speed, to show it is far above every input rate

The four blocks are the peers of `common.interleave` (``--repeats`` rounds, the same order each
round); a block's figure in a round is the median of its epochs, and the goal ratios are the
medians of the per-round ratios. Goal: stoker fit / stoker numpy >= 0.9.

Usage
    python benchmarks/training.py keras-fit              # 3 measured epochs x 2 repeats each
    python benchmarks/training.py keras-fit --max-images 1024 --epochs 2 --repeats 1 --no-keras-peer
"""

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_model(classes: int) -> Any:
    import keras
    from keras import layers, ops

    class Subsample(layers.Layer):
        """Every 16th pixel, as float in [0, 1]: keeps the model's compute negligible."""

        def call(self, x: Any) -> Any:
            return ops.cast(x[:, ::16, ::16, :], "float32") / 255.0

    inputs = keras.Input((224, 224, 3), dtype="uint8")
    x = layers.GlobalAveragePooling2D()(Subsample()(inputs))
    model = keras.Model(inputs, layers.Dense(classes, activation="softmax")(x))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


class EpochTimer:
    """A Keras callback recording wall time per epoch."""

    def __new__(cls) -> Any:
        import keras

        class _Timer(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.times: list[float] = []
                self._t0 = 0.0

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self._t0 = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.times.append(time.perf_counter() - self._t0)

        return _Timer()


def fit_rates(
    model: Any, ds: Any, epochs: int, images_per_epoch: int, shuffle: bool = True
) -> list[float]:
    """img/s of epochs 2..1+epochs of ``model.fit(ds)`` (epoch 1 is the warm-up)."""
    timer = EpochTimer()
    model.fit(ds, epochs=1 + epochs, verbose=0, callbacks=[timer], shuffle=shuffle)
    return [images_per_epoch / t for t in timer.times[1:]]


FIT, KFIT = "stoker fit (loader.keras())", "keras PyDataset fit"


def keras_fit_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=KERAS_FIT_DOC.split("\n\n")[0])
    common.add_data_options(ap, epochs_help="measured epochs (after 1 warm-up)")
    ap.add_argument("--no-keras-peer", action="store_true", help="skip the PyDataset contrast")
    ap.add_argument("--repeats", type=int, default=2, help="rounds (of common.interleave)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    common.print_facts()
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, TF {tf.__version__}")
    items, data = common.data_items(args)
    classes = max(y for _, y in items) + 1
    model = build_model(classes)
    bs = args.batch_size

    def make_stoker() -> Any:
        return peers.make("stoker", items, data=data, batch_size=bs, workers=args.workers)

    # model only: one batch, in memory, repeated
    n = len(items) // bs
    x = np.random.default_rng(0).integers(0, 256, (bs, 224, 224, 3), dtype=np.uint8)
    y = np.zeros(bs, np.int64)
    mem = tf.data.Dataset.from_tensors((x, y)).repeat(n)
    model_only = fit_rates(model, mem, args.epochs, n * bs, shuffle=False)

    epochs: dict[str, list[float]] = {}  # every measured epoch's img/s, per input path

    def block(name: str, rates: Callable[[], list[float]]) -> common.Peer:
        def measure() -> float:
            epochs.setdefault(name, []).extend(rates())
            return common.median(epochs[name][-args.epochs :])

        return common.Peer(name, measure)

    def stoker_numpy() -> list[float]:
        with make_stoker() as pipe:
            common.time_epoch(pipe.obj)  # warm-up
            return [common.time_epoch(pipe.obj).rate for _ in range(args.epochs)]

    def stoker_fit() -> list[float]:
        with make_stoker() as pipe:
            rates = fit_rates(model, pipe.obj.keras(), args.epochs, len(pipe.obj) * bs)
            stats.append(str(pipe.obj.stats()))
            print(stats[-1])
            return rates

    def keras_numpy() -> list[float]:
        with peers.make("keras-pydataset", items, batch_size=bs, workers=args.workers) as pipe:
            common.time_epoch(pipe.epoch())  # warm-up
            return [common.time_epoch(pipe.epoch()).rate for _ in range(args.epochs)]

    def keras_fit() -> list[float]:
        ds = peers.keras_pydataset(items, bs, 224, args.workers)
        return fit_rates(model, ds, args.epochs, len(ds) * bs)

    stats: list[str] = []
    blocks = [block("stoker numpy", stoker_numpy), block(FIT, stoker_fit)]
    if not args.no_keras_peer:
        blocks += [block("keras PyDataset numpy", keras_numpy), block(KFIT, keras_fit)]
    result = common.interleave(blocks, args.repeats, warmup=0, progress="{:,.0f}")
    print(
        f"\n{len(items)} images, batch {bs}, {args.workers} workers; each block's figure is the "
        f"median of its {args.epochs} epochs after a warm-up; {args.repeats} interleaved rounds"
    )
    print(f"model only (in-memory batch): {common.median(model_only):,.0f} img/s")
    common.report(result, "stoker numpy", None)
    goals = [("stoker: fit / numpy", FIT, "stoker numpy", ">= 0.9")]
    if not args.no_keras_peer:
        goals += [
            ("keras PyDataset: fit / numpy (contrast)", KFIT, "keras PyDataset numpy", ">= 0.9"),
            ("stoker fit / keras PyDataset fit", FIT, KFIT, ">= 3.5"),
        ]
    ratios = [  # the median of the per-round ratios against 1
        common.ratio_line(label, result.ratio(a, b)["median"], 1.0, goal)
        for label, a, b, goal in goals
    ]
    print()
    print(common.table(ratios, ["ratio (median of rounds)", "value", "goal", "verdict"]))
    payload = {"images": len(items), "model_only": model_only, "epochs": epochs, "ratios": ratios}
    common.write_json(args.json, {**payload, **result.to_json("stoker numpy"), "stats": stats})
    return 0


# ---------------------------------------------------------------------------- keras-pad

KERAS_PAD_DOC = """\
``pad_to_aspect_ratio=True`` against Keras' ``image_dataset_from_directory`` itself, on the
same JPEGs: how far stoker's pixels are from Keras', and how much of that is the decoder.

For each output size it prints the mean and largest absolute difference (0-255 levels) between
stoker's batches and Keras' (``interpolation="bilinear"`` for both), whether the black border
rows and columns are the same in every image, and the largest difference against
``tf.image.resize_with_pad`` on libjpeg's accurate decode (stoker's decoder; TensorFlow's own
default is the fast integer IDCT). Not on `common.interleave`: it measures pixel differences,
not time, so one pass per size is exact. Usage::

    python benchmarks/training.py keras-pad --folder /tmp/keras_pad --per-class 6
"""

SIZES = [(32, 32), (48, 80), (100, 60), (224, 224)]


def accurate_pad(tf: Any, path: str, size: tuple[int, int]) -> np.ndarray:
    """``tf.image.resize_with_pad`` (bilinear) of ``path`` decoded by libjpeg's accurate IDCT."""
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3, dct_method="INTEGER_ACCURATE")
    return np.asarray(tf.image.resize_with_pad(image, *size, method="bilinear").numpy())


def keras_pad_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=KERAS_PAD_DOC.split("\n")[0])
    parser.add_argument("--folder", default="/tmp/keras_pad")
    parser.add_argument("--per-class", type=int, default=6)
    parser.add_argument("--interpolation", default="bilinear", help="stoker's interpolation")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    import stoker
    from stoker.datasets import make_image_folder

    root = make_image_folder(
        args.folder, classes=2, per_class=args.per_class, min_side=64, max_side=120, seed=1
    )
    files = sorted(str(p) for p in root.glob("*/*.jpg"))
    n = len(files)
    results = []
    for size in SIZES:
        both = {"image_size": size, "batch_size": n, "shuffle": False, "pad_to_aspect_ratio": True}
        ds = keras.utils.image_dataset_from_directory(
            str(root), **both, verbose=False, interpolation="bilinear"
        )
        theirs = np.concatenate([x.numpy() for x, _ in ds])
        mine = {"augment": None, "workers": 0, "interpolation": args.interpolation}
        with stoker.Loader(root, **both, **mine, drop_last=False) as loader:
            ours = np.concatenate([x for x, _ in loader]).astype(np.float32)
        same_border = all(
            np.array_equal(
                (theirs[i] == 0).all(axis=(1 - a, 2)), (ours[i] == 0).all(axis=(1 - a, 2))
            )
            for i in range(n)
            for a in (0, 1)
        )
        accurate = np.stack([accurate_pad(tf, f, size) for f in files])
        d = np.abs(ours - theirs)
        r = {"size": size, "mean": d.mean(), "max": d.max(), "same_border": same_border}
        r["max_vs_accurate"] = np.abs(ours - accurate).max()
        results.append(r)
        print(
            f"{size[0]}x{size[1]}: vs keras mean {r['mean']:.2f} max {r['max']:.1f}, same border "
            f"{same_border}; vs resize_with_pad(accurate decode) max {r['max_vs_accurate']:.2f}"
        )
    common.write_json(args.json, {"sizes": results})


# ---------------------------------------------------------------------------- overlap

OVERLAP_DOC = """\
The user's scenario: does loading overlap with training? Epoch time with a fake train step.

The "train step" takes as long as the loader needs to produce a batch, the hardest case for
overlap (input and compute exactly balanced): T = stoker's load-only epoch time / batches,
measured first. The step is ``time.sleep(T)``: a real accelerator step leaves the CPU free, and
on this 2-core machine a busy-waiting main thread would take a whole core from the 2 workers
(pass --busy to see that case). Every pipeline trains on the same number of batches of 256.

    stoker         Loader(workers=2); `for x, y in loader: step()`; epochs back to back, as in
                   training (its prefetch runs across epoch boundaries)
    naive          what the user did before: load a chunk of --chunk images (default 8,000, or
                   the whole epoch if smaller) synchronously in the main process with Pillow
                   (keras load_img-style open + the same RandomResizedCrop + flip), then
                   "train" on it batch by batch, then load the next chunk...
    torch-pillow   PyTorch DataLoader(num_workers=2, persistent_workers=True) + Pillow (peers.py)

For each: L = load-only epoch time, C = compute = batches x T, E = epoch time with the step.
overlap ratio = E / max(C, L): 1.0 is perfect overlap, 2.0 is no overlap at all. Goal: stoker
<= 1.05. The load-only and the training epochs ALTERNATE (round r: L_r, then E_r) and the ratio
is the median of E_r / max(C, L_r) (L and E of a pipeline are the peers of `common.interleave`;
the pipelines themselves run one after another, so that no idle pipeline's workers share the
cores with the timed one): this VM's speed drifts by ~10% over tens of seconds, and
with compute and loading balanced exactly, a load-only figure taken a minute earlier decides
the ratio more than the overlap does. stoker's load-only epoch is its steady stream with the
batches made ahead while idle drained first (common.time_stream); its training epoch is
likewise the steady span of continuous training: from the arrival of a batch, len(loader)
times "step, then take the next batch" (an isolated epoch would add a pipeline fill and a last
step that continuous training overlaps with the next epoch: +1/len(loader), ~4% here).

Usage
    python benchmarks/training.py overlap                          # full dataset, 3 epochs each
    python benchmarks/training.py overlap --max-images 1024 --epochs 1   # smoke
"""


def make_step(seconds: float, busy: bool) -> Callable[[Any], None]:
    """The fake train step: sleep (accelerator-like) or busy-wait (CPU-bound) ``seconds``."""
    if busy:

        def step(_: Any) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
    else:

        def step(_: Any) -> None:
            time.sleep(seconds)

    return step


def steady_training(stream: Any, batches: int, step: Callable[[Any], None]) -> float:
    """Seconds for ``batches`` cycles of (step, next batch), from a batch's arrival."""
    batch = next(stream)
    t0 = time.perf_counter()
    for _ in range(batches):
        step(batch)
        batch = next(stream)
    return time.perf_counter() - t0


def naive_epoch(
    items: list[tuple[str, int]],
    batches: int,
    batch_size: int,
    chunk: int,
    step: Callable[[Any], None] | None,
    rng: random.Random,
) -> tuple[float, float]:
    """Load-a-chunk-then-train epoch; returns (epoch seconds, seconds spent loading)."""
    order = list(range(len(items)))
    rng.shuffle(order)
    order = order[: batches * batch_size]
    t0, loading = time.perf_counter(), 0.0
    for start in range(0, len(order), chunk):
        ids = order[start : start + chunk]
        t1 = time.perf_counter()
        x = np.empty((len(ids), 224, 224, 3), np.uint8)
        y = np.empty(len(ids), np.int64)
        for j, i in enumerate(ids):
            x[j] = peers.pil_sample(items[i][0], 224, rng)
            y[j] = items[i][1]
        loading += time.perf_counter() - t1
        if step is not None:
            for b in range(0, len(ids), batch_size):
                step((x[b : b + batch_size], y[b : b + batch_size]))
    return time.perf_counter() - t0, loading


def overlap_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=OVERLAP_DOC.split("\n\n")[0])
    common.add_data_options(ap)
    ap.add_argument("--chunk", type=int, default=8000, help="naive: images loaded per chunk")
    ap.add_argument("--busy", action="store_true", help="busy-wait instead of sleep")
    ap.add_argument("--only", default="stoker,naive,torch-pillow")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))

    facts = common.print_facts()
    items, data = common.data_items(args)
    results: dict[str, dict[str, Any]] = {}

    # stoker first: it defines T
    stoker_pipe = peers.make(
        "stoker", items, data=data, batch_size=args.batch_size, workers=args.workers
    )
    loader = stoker_pipe.obj
    n = len(loader)
    with stoker_pipe:
        stream = loader.stream()
        common.time_stream(stream, n)  # warm-up: worker start
        t_step = common.time_stream(stream, n)[0].seconds / n
        step = make_step(t_step, args.busy)
        print(
            f"stoker load-only epoch {t_step * n:.2f} s for {n} batches -> "
            f"train step T = {t_step * 1000:.1f} ms ({'busy-wait' if args.busy else 'sleep'})"
        )
        waits: list[float] = []

        def train() -> float:
            s0 = loader.stats()
            seconds = steady_training(stream, n, step)
            s1 = loader.stats()
            waits.append((s1.wait_s - s0.wait_s) / max(1e-9, s1.elapsed_s - s0.elapsed_s))
            return seconds

        load = common.Peer("stoker load-only", lambda: common.time_stream(stream, n)[0].seconds)
        rounds = [common.interleave([load, common.Peer("stoker training", train)], args.epochs, 0)]
        loads, epochs = rounds[0].values.values()
        share = sum(waits) / len(waits)
        results["stoker"] = {"load": loads, "epochs": epochs, "wait_share": share}
        print(
            f"  stoker load-only {[round(e, 2) for e in loads]}, with training "
            f"{[round(e, 2) for e in epochs]}; waited for data {share:.1%} of the time "
            "(stoker's stats, training epochs only)"
        )
    compute = n * t_step

    if "torch-pillow" in only:
        with peers.make(
            "torch-pillow", items, batch_size=args.batch_size, workers=args.workers
        ) as dl:
            common.time_epoch(dl.epoch())  # warm-up: worker start
            sides = [
                common.Peer(
                    "torch-pillow load-only", lambda: common.time_epoch(dl.epoch()).seconds
                ),
                common.Peer(
                    "torch-pillow training", lambda: common.time_epoch(dl.epoch(), step).seconds
                ),
            ]
            rounds.append(common.interleave(sides, args.epochs, 0))
        loads, epochs = rounds[-1].values.values()
        results["torch-pillow"] = {"load": loads, "epochs": epochs}
        print(
            f"  torch-pillow load-only {[round(e, 2) for e in loads]}, with training "
            f"{[round(e, 2) for e in epochs]}"
        )

    if "naive" in only:
        rng = random.Random(0)

        def naive() -> dict[str, float]:
            epoch, loading = naive_epoch(items, n, args.batch_size, args.chunk, step, rng)
            return {"epoch": epoch, "loading": loading}

        rounds.append(common.interleave([common.Peer("naive", naive)], args.epochs, 0))
        epochs, loads = rounds[-1].values.values()
        results["naive"] = {"load": loads, "epochs": epochs}
        print(
            f"  naive epochs {[round(e, 2) for e in epochs]} (of which loading "
            f"{[round(x, 2) for x in loads]})"
        )

    rows = []
    for name, r in results.items():
        load, epoch = common.median(r["load"]), common.median(r["epochs"])
        ratio = common.median(
            [e / max(compute, x) for e, x in zip(r["epochs"], r["load"], strict=True)]
        )
        goal = "<= 1.05" if name == "stoker" else ""
        verdict = ("PASS" if ratio <= 1.05 else "MISS") if goal else ""
        r.update(load_s=load, epoch_s=epoch, compute_s=compute, ratio=ratio)
        rows.append(
            [name, f"{load:.2f}", f"{compute:.2f}", f"{epoch:.2f}", f"{ratio:.2f}", goal, verdict]
        )
    print(
        f"\n{n} batches of {args.batch_size} per epoch; train step {t_step * 1000:.1f} ms "
        f"({'busy-wait' if args.busy else 'sleep: leaves the CPU to the workers'}); "
        f"medians of {args.epochs} rounds (ratio: median of the per-round ratios)"
    )
    print(
        common.table(
            rows,
            "pipeline|load-only s|compute s|epoch s|epoch/max(C,L)|goal|verdict".split("|"),
        )
    )
    if "naive" in results and "stoker" in results:
        print(
            f"stoker epoch is {results['naive']['epoch_s'] / results['stoker']['epoch_s']:.2f}x"
            " faster than load-then-train"
        )
    merged = common.Result({k: v for r in rounds for k, v in r.values.items()}, args.epochs, 0)
    print(common.table(merged.rows(unit="s"), merged.header(unit="s")))
    payload = {"facts": facts, "images": len(items), "step_s": t_step, "results": results}
    common.write_json(args.json, {**payload, "rounds": merged.to_json()})
    return 0


# ---------------------------------------------------------------------------- cases

# ---------------------------------------------------------------------------- elastic

ELASTIC_DOC = """\
Steps you can address, on the ImageNet-like folder (augment="train", 224 px):

    one batch          ``peek(k)`` of a batch of the current epoch, its order already built:
                       one batch's read + decode + augment in this process (the baseline)
    batch_at late      ``batch_at(epoch, len - 2)`` of an epoch not yet asked about (its order
                       built in the call), workers=0: nothing before the step is replayed
    samples_at         ``samples_at(epoch, step)`` of the whole global batch (8 ranks of
                       batch_size / 8), the epoch's order built (median of 200 calls; the
                       first call of an epoch, which builds it, is reported apart)
    first batch fresh  a new Loader's first batch at the start of an epoch (workers started)
    first batch late   a new Loader, ``load_state_dict`` at step len - 2, its first batch

Each round measures every figure once, in that order; the figures are medians over rounds,
the ratios medians of the rounds' own ratios.
Goals: batch_at late / one batch <= 1.5; samples_at in microseconds; first batch late / first
batch fresh <= 1.1.

Usage
    python benchmarks/training.py elastic --rounds 5
    python benchmarks/training.py elastic --max-images 512 --batch-size 32 --rounds 1   # smoke
"""


def _elastic_round(data: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    import stoker

    kw = dict(data, batch_size=args.batch_size, image_size=224, augment="train", seed=1)
    out: dict[str, float] = {}
    with stoker.Loader(workers=0, **kw) as loader:
        late = len(loader) - 2
        loader.peek(0)  # the epoch's order built
        t0 = time.perf_counter()
        loader.peek(late)
        out["one batch"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        loader.batch_at(3, late)
        out["batch_at late"] = time.perf_counter() - t0
    per_rank = {**kw, "batch_size": max(1, args.batch_size // 8)}  # the same global batch
    with stoker.Loader(workers=0, rank=0, world_size=8, **per_rank) as ranked:
        t0 = time.perf_counter()
        ranked.samples_at(5, 1 % len(ranked))
        out["samples_at first"] = time.perf_counter() - t0
        times = []
        for step in range(200):
            t0 = time.perf_counter()
            ranked.samples_at(5, step % len(ranked))
            times.append(time.perf_counter() - t0)
        out["samples_at"] = common.median(times)
    for name, position in (("first batch fresh", 0), ("first batch late", late)):
        with stoker.Loader(workers=args.workers, **kw) as loader:
            if position:
                state = loader.state_dict()
                loader.load_state_dict({**state, "position": position})
            t0 = time.perf_counter()
            next(iter(loader))
            out[name] = time.perf_counter() - t0
    return out


def elastic_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=ELASTIC_DOC, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common.add_data_options(parser)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    items, folder = common.data_items(args)
    data: dict[str, Any] = (
        {"source": folder}
        if folder
        else {"paths": [p for p, _ in items], "labels": [label for _, label in items]}
    )
    common.print_facts()
    rounds = [_elastic_round(data, args) for _ in range(args.rounds)]
    figures = {name: common.median([r[name] for r in rounds]) for name in rounds[0]}
    rows = [[name, f"{value * 1e3:.3f}"] for name, value in figures.items()]
    print(common.table(rows, ["figure", "ms (median)"]))

    def per_round(num: str, den: str) -> float:  # the median of the rounds' own ratios
        return common.median([r[num] / r[den] for r in rounds])

    ratios = [
        common.ratio_line(
            "batch_at late / one batch", per_round("batch_at late", "one batch"), 1.0, "<= 1.5"
        ),
        common.ratio_line(
            "first batch late / fresh",
            per_round("first batch late", "first batch fresh"),
            1.0,
            "<= 1.1",
        ),
    ]
    print(common.table(ratios, ["ratio", "value", "goal", ""]))
    print(f"samples_at: {figures['samples_at'] * 1e6:.1f} us a call (8 ranks' global batch)")
    common.write_json(args.json, {"rounds": rounds, "figures": figures})
    return 0


CASES = common.cases(keras_fit_main, keras_pad_main, overlap_main, elastic_main)


if __name__ == "__main__":
    sys.exit(common.run_cases(__doc__, CASES))
