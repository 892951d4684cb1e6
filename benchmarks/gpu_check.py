"""The prepared GPU check: one command on a 1-GPU, 16-core machine (no network, < 8 minutes).

    python benchmarks/gpu_check.py --out /tmp/gpu_check          # on the GPU machine
    python benchmarks/gpu_check.py --dry-run --out /tmp/dry      # on CPU: small, CUDA skipped

What it does, in order (each part in its own process, so CPU and memory are measured apart):

1. setup: stoker from this tree (``src/`` on the path, the C extension built in place when a
   compiler and libjpeg headers are there); the packages ``import stoker`` and the tests need
   and the machine lacks (simplejpeg, cloudpickle, pytest) from the wheels in benchmarks/wheels.
2. data: an ImageNet-like ImageFolder (shorter side 300-500 px, ~100 KB JPEGs) from the photos
   carried in benchmarks/photos (the recipe of ``stoker.datasets.make_image_folder``).
3. the CUDA tests (tests/test_cuda_transfer.py, the CUDA test of tests/test_torch.py) and the
   resume / slot-churn tests of tests/test_resume.py, whose JAX cases then run on the GPU.
4. a torchvision ResNet-50 (bf16 autocast, channels-last, SGD) trained for a fixed number of
   steps, fed by (a) stoker ``torch(device="cuda")``, (b) the torch DataLoader with Pillow
   (RandomResizedCrop + flip), ``pin_memory=True``, (c) the DataLoader reading bytes and
   ``torchvision.io.decode_jpeg(device="cuda")`` with the crop and flip on the GPU; for each:
   img/s, the GPU's wait share (CUDA events around each wait for data), host CPU ms per image,
   peak PSS of the process tree.
5. stoker's throughput without a model at 1, 2, 4, 8 and 15 workers (the scaling curve).
6. the same on a Ray cluster (when Ray is installed): the trainer on core 0 decoding nothing,
   one simulated Ray node (``ray.cluster_utils.Cluster``) on 1, 2, 4, 8 and 15 other cores
   (``Loader(cluster="ray", cluster_workers=N)``, the TCP data path): img/s, the trainer's CPU
   per image and its receive cost (the cluster curve, ``benchmarks/cluster.py`` on one node).

Results: ``OUT/gpu_check.json`` and a short table (printed, and ``OUT/gpu_check.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WHEELS = HERE / "wheels"
NEEDED = ("simplejpeg", "cloudpickle", "pytest", "pytest_timeout", "pygments")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FULL = {
    "classes": 100,
    "per_class": 100,
    "batch": 256,
    "warmup": 35,
    "steps": 60,
    "workers": 15,
    "scale": [1, 2, 4, 8, 15],
    "scale_batches": 12,
    "child_s": 240,
    "cluster_scale": [1, 2, 4, 8, 15],
}
DRY = {
    "classes": 3,
    "per_class": 12,
    "batch": 8,
    "warmup": 2,
    "steps": 3,
    "workers": 1,
    "scale": [1, 2],
    "scale_batches": 3,
    "child_s": 240,
    "min_side": 64,
    "max_side": 120,
    "cluster_scale": [1],
}


# ---------------------------------------------------------------------------- setup


def setup(site: Path, build: bool) -> dict[str, Any]:
    """Build this tree's C extension (``build``), and install the packages it lacks from the
    carried wheels into ``site``; returns what was done."""
    done: dict[str, Any] = {"python": sys.version.split()[0]}
    missing = [mod for mod in NEEDED if importlib.util.find_spec(mod) is None]
    if missing:  # a wheel is a zip: unpacked onto the path, it imports (no pip, no network)
        site.mkdir(parents=True, exist_ok=True)
        for wheel in sorted(WHEELS.glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
    done["installed_from_wheels"] = missing
    if not build:
        done["c_extension_build"] = "skipped (dry run: the tree is left as it is)"
        return done
    made = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    done["c_extension_build"] = "ok" if made.returncode == 0 else made.stderr[-300:]
    return done


def environment(site: Path) -> dict[str, str]:
    """The environment of every child: this tree's stoker, the wheels, benchmarks/."""
    path = [str(ROOT / "src"), str(site), str(HERE), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def child(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run ``gpu_check.py --child ...`` with its process tree's peak PSS sampled from here."""
    from common import PeakPss

    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with PeakPss(proc.pid) as pss:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"error": f"timed out after {timeout:.0f} s", "stderr": err[-1500:]}
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}", "stderr": err[-1500:]}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["peak_pss_mib"] = round(pss.peak / 2**20, 1)
    return result


# ---------------------------------------------------------------------------- feeders


def _rrc_box(rng: Any, width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3): left, top, w, h."""
    import math

    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side, side


class PilFolder:
    """ImageFolder with Pillow: RandomResizedCrop(224) + flip, uint8 HWC (peer (b))."""

    def __init__(self, root: str, size: int, raw: bool = False) -> None:
        self.items = sorted(
            (str(p), int(p.parent.name.split("_")[1])) for p in Path(root).glob("class_*/*.jpg")
        )
        self.size, self.raw = size, raw

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        import numpy as np
        import torch

        path, label = self.items[i]
        if self.raw:  # peer (c): the file's bytes, decoded on the GPU
            with open(path, "rb") as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8), label
        from PIL import Image

        rng = np.random.default_rng()
        with Image.open(path) as im:
            im = im.convert("RGB")
            left, top, w, h = _rrc_box(rng, *im.size)
            im = im.resize(
                (self.size, self.size),
                Image.Resampling.BILINEAR,
                box=(left, top, left + w, top + h),
            )
            if rng.random() < 0.5:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            return torch.from_numpy(np.asarray(im).copy()), label


def _listed(batch: list) -> tuple[list, Any]:
    import torch

    return [b[0] for b in batch], torch.tensor([b[1] for b in batch])


def feed(kind: str, data: str, cfg: dict[str, Any], device: Any) -> Any:
    """Batches ``(x float NCHW channels-last normalised, y)`` on ``device``, without end."""
    import torch

    batch, size, workers = cfg["batch"], 224 if not cfg.get("min_side") else 32, cfg["workers"]
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    if kind == "stoker":
        import stoker

        loader = stoker.Loader(data, batch_size=batch, image_size=size, workers=workers, seed=0)
        view = loader.torch(device=device, dtype=torch.float32, mean=MEAN, std=STD)
        while True:
            yield from view
    loader_kw = {
        "batch_size": batch,
        "shuffle": True,
        "num_workers": workers,
        "drop_last": True,
        "persistent_workers": True,
        "prefetch_factor": 2,
    }
    if kind == "dataloader_pil":
        dl = torch.utils.data.DataLoader(
            PilFolder(data, size), pin_memory=device.type == "cuda", **loader_kw
        )
        while True:
            for x, y in dl:
                x = x.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
                yield (x - mean) / std, y.to(device, non_blocking=True)
    if kind == "dataloader_nvjpeg":
        from torchvision.io import decode_jpeg
        from torchvision.transforms.v2 import functional as F

        dl = torch.utils.data.DataLoader(
            PilFolder(data, size, raw=True), collate_fn=_listed, **loader_kw
        )
        import numpy as np

        rng = np.random.default_rng(0)
        while True:
            for raw, y in dl:
                # decode_jpeg(device="cuda") may write into blocks freed while kernels queued on
                # this stream still read them (pytorch/vision PR 9606): on the H100 the model
                # trained to NaN in 3 of 3 runs without a wait, and like (b) with one each step
                torch.cuda.synchronize(device)
                images = decode_jpeg(raw, device=device)
                crops = []
                for im in images:
                    left, top, w, h = _rrc_box(rng, im.shape[2], im.shape[1])
                    im = F.resized_crop(im, top, left, h, w, [size, size], antialias=False)
                    crops.append(F.horizontal_flip(im) if rng.random() < 0.5 else im)
                x = torch.stack(crops).float()
                yield (x - mean) / std, y.to(device, non_blocking=True)
    raise ValueError(kind)


def train(kind: str, data: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train for ``warmup + steps`` steps fed by ``kind``; the figures of the last ``steps``."""
    import torch
    from common import tree_cpu

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    try:
        import torchvision

        model = torchvision.models.resnet50(num_classes=1000)
    except ImportError:  # a CPU dry run without torchvision: a small stand-in
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 1000),
        )
    model = model.to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = feed(kind, data, cfg, device)
    pairs, host_wait, images = [], 0.0, 0
    checks: dict[str, Any] = {}
    loss = torch.zeros(())
    t0 = cpu0 = 0.0
    start = end = None
    for step in range(cfg["warmup"] + cfg["steps"]):
        timed = step >= cfg["warmup"]
        if step == cfg["warmup"]:
            if cuda:
                torch.cuda.synchronize()
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            t0, cpu0 = time.perf_counter(), tree_cpu()
            checks["loss_after_warmup"] = float(loss)
        asked = time.perf_counter()
        if cuda and timed:
            a = torch.cuda.Event(enable_timing=True)
            a.record()
        x, y = next(batches)
        if step == 0:  # what the model is fed, once, before the timed steps
            first = x.float()
            checks["input"] = {
                "min": float(first.min()),
                "max": float(first.max()),
                "mean": round(float(first.mean()), 4),
                "finite": bool(torch.isfinite(first).all()),
            }
        if cuda and timed:
            b = torch.cuda.Event(enable_timing=True)
            b.record()
            pairs.append((a, b))
        if timed:
            host_wait += time.perf_counter() - asked
            images += len(y)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if cuda:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - t0, tree_cpu() - cpu0
    out = {
        "feeder": kind,
        "images": images,
        "img_s": round(images / seconds, 1),
        "host_wait_share": round(host_wait / seconds, 4),
        "cpu_ms_per_img": round(1000 * cpu / images, 3),
        "loss": float(loss),
        **checks,
    }
    if cuda and start is not None and end is not None:
        gpu_wait = sum(a.elapsed_time(b) for a, b in pairs)
        out["gpu_wait_share"] = round(gpu_wait / start.elapsed_time(end), 4)
    return out


def scale(data: str, cfg: dict[str, Any], workers: int) -> dict[str, Any]:
    """stoker alone (no model): img/s and CPU per image at ``workers`` workers."""
    from common import tree_cpu

    import stoker

    size = 224 if not cfg.get("min_side") else 32
    with stoker.Loader(
        data, batch_size=cfg["batch"], image_size=size, workers=workers, seed=0
    ) as loader:
        stream = loader.stream()
        for _ in range(1 + 2 * workers):  # start-up, then the batches prefetched meanwhile
            next(stream)
        t0, cpu0, images = time.perf_counter(), tree_cpu(), 0
        for _ in range(max(cfg["scale_batches"], 4 * workers)):
            images += len(next(stream)[1])
        seconds, cpu = time.perf_counter() - t0, tree_cpu() - cpu0
        decoder = loader.stats().decoder
    return {
        "workers": workers,
        "img_s": round(images / seconds, 1),
        "cpu_ms_per_img": round(1000 * cpu / images, 3),
        "decoder": decoder,
    }


def _pin_threads(cores: set[int]) -> None:
    """Every thread of this process onto ``cores`` (what processes started later inherit)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cores)


def cluster_scale(data: str, cfg: dict[str, Any], cores: int) -> dict[str, Any]:
    """stoker on a one-node Ray cluster of ``cores`` cores (1..cores), the trainer on core 0
    decoding nothing: img/s, the trainer's CPU and receive cost per image."""
    if importlib.util.find_spec("ray") is None:
        return {"cores": cores, "skipped": "ray is not installed"}
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    import stoker

    _pin_threads(set(range(1, cores + 1)))  # the Ray node's processes inherit these cores
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    cluster.add_node(num_cpus=cores)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        cluster.wait_for_nodes()
        _pin_threads({0})
        size = 224 if not cfg.get("min_side") else 32
        with stoker.Loader(
            data,
            batch_size=cfg["batch"],
            image_size=size,
            workers=0,
            seed=0,
            cluster="ray",
            cluster_workers=cores,
            cluster_listen="127.0.0.1",
        ) as loader:
            stream = loader.stream()
            for _ in range(1 + 2 * cores):
                next(stream)
            _pin_threads({0})  # the loader's receiving threads too
            me = psutil.Process()
            t0, cpu0, images = time.perf_counter(), sum(me.cpu_times()[:2]), 0
            for _ in range(max(cfg["scale_batches"], 4 * cores)):
                images += len(next(stream)[1])
            seconds, cpu = time.perf_counter() - t0, sum(me.cpu_times()[:2]) - cpu0
            report = loader.stats().cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
    return {
        "cores": cores,
        "img_s": round(images / seconds, 1),
        "trainer_cpu_ms_per_img": round(1000 * cpu / images, 3),
        "receive_ms_per_img": round(report["receive_ms_per_image"], 4),
        "wire_kb_per_img": round(report["wire_bytes_per_image"] / 1e3, 1),
    }


def transfer_line(data: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Which host->device path stoker chose, and its stats() report after a few batches."""
    import torch

    import stoker

    with stoker.Loader(
        data, batch_size=cfg["batch"], image_size=224, workers=cfg["workers"], seed=0
    ) as loader:
        meter = loader.wait_meter(every=4)
        figures = None
        for x, _ in loader.torch(device="cuda"):
            x.float().mean()
            figures = meter.step() or figures
        torch.cuda.synchronize()
        report = loader.stats()
    return {
        "transfer": report.transfer,
        "device_wait_s": report.device_wait_s,
        "meter": dict(figures or {}),
        "stats": str(report),
    }


# ---------------------------------------------------------------------------- main


def run_child(argv: list[str]) -> None:
    """``--child KIND DATA CFG_JSON [WORKERS]``: one measurement, printed as ``RESULT {json}``."""
    kind, data, cfg = argv[0], argv[1], json.loads(argv[2])
    if kind == "scale":
        result = scale(data, cfg, int(argv[3]))
    elif kind == "cluster_scale":
        result = cluster_scale(data, cfg, int(argv[3]))
    elif kind == "transfer":
        result = transfer_line(data, cfg)
    else:
        result = train(kind, data, cfg)
    print("RESULT " + json.dumps(result), flush=True)


TRAIN_COLUMNS = (
    ("feeder", "feeder"),
    ("img/s", "img_s"),
    ("GPU wait share", "gpu_wait_share"),
    ("host wait share", "host_wait_share"),
    ("CPU ms/img", "cpu_ms_per_img"),
    ("peak PSS MiB", "peak_pss_mib"),
)
CLUSTER_COLUMNS = (
    ("Ray node cores", "cores"),
    ("img/s", "img_s"),
    ("trainer CPU ms/img", "trainer_cpu_ms_per_img"),
    ("receive ms/img", "receive_ms_per_img"),
    ("KB/img on the wire", "wire_kb_per_img"),
)
SCALE_COLUMNS = (
    ("stoker workers", "workers"),
    ("img/s", "img_s"),
    ("CPU ms/img", "cpu_ms_per_img"),
    ("peak PSS MiB", "peak_pss_mib"),
)


def _markdown(entries: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> list[str]:
    """One markdown table: a row per entry (an error shown in place of its figures)."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in entries:
        if "error" in r or "skipped" in r:
            said = f"error: {r['error']}" if "error" in r else f"skipped: {r['skipped']}"
            cells = [str(r.get(columns[0][1], "?")), said]
            cells += [""] * (len(columns) - 2)
        else:
            cells = [f"{r[k]:,.0f}" if k == "img_s" else str(r.get(k, "-")) for _, k in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def table(results: dict[str, Any]) -> str:
    """The short table of the training runs and the scaling curve (markdown)."""
    return "\n".join(
        _markdown(results["train"], TRAIN_COLUMNS)
        + [""]
        + _markdown(results["scale"], SCALE_COLUMNS)
        + [""]
        + _markdown(results.get("cluster_scale", []), CLUSTER_COLUMNS)
    )


def save(out: Path, results: dict[str, Any]) -> None:
    """Write what is measured so far: a run stopped at its limit keeps its finished parts."""
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check_out", help="folder for data and results")
    parser.add_argument("--dry-run", action="store_true", help="CPU: small sizes, no CUDA")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child)
        return 0
    cfg = DRY if args.dry_run else FULL
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "dry_run": args.dry_run,
        "config": cfg,
    }
    results["setup"] = setup(out / "site", build=not args.dry_run)
    save(out, results)
    env = environment(out / "site")
    sys.path[:0] = [str(ROOT / "src"), str(out / "site"), str(HERE)]
    import photo_source
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    results["device"] = torch.cuda.get_device_name(0) if cuda else "cpu (CUDA parts skipped)"
    results["cpus"] = os.cpu_count()
    t0 = time.perf_counter()
    data = photo_source.make_folder(
        out / "data",
        cfg["classes"],
        cfg["per_class"],
        min(16, os.cpu_count() or 1),
        cfg.get("min_side", 300),
        cfg.get("max_side", 500),
    )
    results["data"] = {
        "path": str(data),
        "images": cfg["classes"] * cfg["per_class"],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(f"data: {results['data']}", flush=True)
    save(out, results)
    if cuda:
        tests = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "photo_source",
                "tests/test_cuda_transfer.py",
                "tests/test_torch.py",
                "tests/test_resume.py",
                "-k",
                "cuda or resume or kept",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        results["cuda_tests"] = {
            "returncode": tests.returncode,
            "tail": tests.stdout[-1500:] + tests.stderr[-500:],
        }
        print(f"cuda tests: {results['cuda_tests']}", flush=True)
        results["transfer"] = child(["transfer", str(data), json.dumps(cfg)], env, cfg["child_s"])
        print(f"transfer: {results['transfer']}", flush=True)
        save(out, results)
    else:
        results["cuda_tests"] = "skipped: no CUDA device (or --dry-run)"
        print("CUDA tests, stoker's transfer line and peer (c) skipped: no CUDA", flush=True)
    kinds = ["stoker", "dataloader_pil"] + (["dataloader_nvjpeg"] if cuda else [])
    results["train"] = []
    for kind in kinds:
        r = child([kind, str(data), json.dumps(cfg)], env, cfg["child_s"])
        r.setdefault("feeder", kind)
        results["train"].append(r)
        print(f"train {kind}: {r}", flush=True)
        save(out, results)
    results["scale"] = []
    for w in cfg["scale"]:
        r = child(["scale", str(data), json.dumps(cfg), str(w)], env, cfg["child_s"])
        results["scale"].append(r)
        print(f"scale {w}: {r}", flush=True)
        save(out, results)
    results["cluster_scale"] = []
    for cores in [c for c in cfg["cluster_scale"] if c < (os.cpu_count() or 1)]:
        r = child(["cluster_scale", str(data), json.dumps(cfg), str(cores)], env, cfg["child_s"])
        results["cluster_scale"].append(r)
        print(f"cluster {cores}: {r}", flush=True)
    results["seconds"] = round(time.perf_counter() - t_start, 1)
    save(out, results)
    text = table(results)
    (out / "gpu_check.md").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'gpu_check.json'} in {results['seconds']} s")
    failed = [
        r for r in results["train"] + results["scale"] + results["cluster_scale"] if "error" in r
    ]
    with contextlib.suppress(TypeError, AttributeError):
        failed += [1] if results["cuda_tests"]["returncode"] else []
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
