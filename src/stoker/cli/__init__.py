"""The ``stoker`` command: demo, bench, inspect, doctor, convert."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stoker", description="Keep an accelerator fed.")
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="make a small photo dataset, train Keras on it, print stats")
    demo.add_argument("--out", default="demo_data", help="folder for the generated dataset")
    demo.add_argument("--epochs", type=int, default=2)
    demo.add_argument("--workers", default="auto")
    bench = sub.add_parser("bench", help="measure throughput, the decode ceiling, the bottleneck")
    bench.add_argument("source")
    bench.add_argument("--batch-size", type=int, default=256)
    bench.add_argument("--image-size", type=int, default=224)
    bench.add_argument("--augment", default="train", help="train, eval or none")
    bench.add_argument("--workers", default="auto")
    bench.add_argument("--epochs", type=int, default=3, help="measured epochs after a warm-up")
    bench.add_argument("--max-batches", type=int, default=0, help="cap batches per epoch")
    inspect = sub.add_parser("inspect", help="counts, classes, image sizes, bad files")
    inspect.add_argument("source")
    inspect.add_argument("--decode", action="store_true", help="fully decode every image")
    doctor = sub.add_parser("doctor", help="shared memory, leaked segments, decoders")
    doctor.add_argument("--clean", action="store_true", help="remove segments of dead processes")
    conv = sub.add_parser("convert", help="write a source as Parquet shards (resumable)")
    conv.add_argument("src", help="any stoker source: image folder, CSV, .npy, tar, HDF5...")
    conv.add_argument("dst", help="folder for the shards, errors.csv and the manifest")
    conv.add_argument("--max-side", type=int, default=None, help="shrink longer sides above N px")
    conv.add_argument("--quality", type=int, default=None, help="re-encode as JPEG at quality Q")
    conv.add_argument("--workers", type=int, default=1, help="processes writing shards")
    conv.add_argument("--shard-mb", type=float, default=256, help="target shard size in MB")
    conv.add_argument("--row-group-mb", type=float, default=4, help="target row group size in MB")
    conv.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        help="store samples in a seeded random order (for block shuffling)",
    )
    conv.add_argument("--engine", choices=("local", "ray"), default="local",
                      help="local processes, or Ray tasks (needs stoker[ray])")
    conv.add_argument("--ray-address", default=None,
                      help="Ray cluster to join with --engine ray (default: a local one)")
    conv.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _workers(value: str) -> int | str:
    return value if value == "auto" else int(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        run_demo(args.out, epochs=args.epochs, workers=_workers(args.workers))
    elif args.command == "bench":
        from .bench import run_bench

        augment = None if args.augment.lower() == "none" else args.augment
        print(
            run_bench(
                args.source,
                batch_size=args.batch_size,
                image_size=args.image_size,
                augment=augment,
                workers=_workers(args.workers),
                epochs=args.epochs,
                max_batches=args.max_batches,
            )
        )
    elif args.command == "inspect":
        from .inspect import inspect_source

        print(inspect_source(args.source, decode=args.decode))
    elif args.command == "convert":
        from .convert import convert

        manifest = convert(
            args.src,
            args.dst,
            max_side=args.max_side,
            quality=args.quality,
            workers=args.workers,
            shard_bytes=int(args.shard_mb * 2**20),
            row_group_bytes=int(args.row_group_mb * 2**20),
            progress=not args.quiet,
            shuffle_seed=args.shuffle_seed,
            engine=args.engine,
            ray_address=args.ray_address,
        )
        run = manifest["run"]
        print(
            f"stoker convert: {manifest['rows']} images in {len(manifest['shards'])} shards "
            f"({run['shards_built']} written, {run['shards_kept']} kept from an earlier run), "
            f"{manifest['errors']} skipped (see errors.csv); {run['images_per_s'] or 0:,.0f} "
            f"img/s; manifest {args.dst}/stoker-manifest.json"
        )
    else:
        from .doctor import doctor

        print(doctor(clean=args.clean))
    return 0


if __name__ == "__main__":
    sys.exit(main())
