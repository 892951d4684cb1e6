"""The ``stoker`` command: demo, bench, inspect, doctor."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stoker", description="Keep an accelerator fed.")
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="make a small photo dataset, train Keras on it, print stats")
    demo.add_argument("--out", default="demo_data", help="folder for the generated dataset")
    demo.add_argument("--epochs", type=int, default=1)
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
    else:
        from .doctor import doctor

        print(doctor(clean=args.clean))
    return 0


if __name__ == "__main__":
    sys.exit(main())
