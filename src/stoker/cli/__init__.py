"""The ``stoker`` command: demo, bench, inspect, show, doctor, convert.

It speaks plainly: a missing path, a bad option or an unreadable file gives one line on stderr
and a non-zero exit (2 for a bad command line, 1 for a failure, 130 for Ctrl-C), never a
traceback; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .messages import plain, plain_warnings


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line reported in one line (and where to find help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _whole(value: str, least: int, most: int | None = None, what: str = "a whole number") -> int:
    """``value`` as an int in ``least..most``, or the argparse error saying what to give."""
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least or (most is not None and number > most):
        span = f">= {least}" if most is None else f"in {least}..{most}"
        raise argparse.ArgumentTypeError(f"give {what} {span}, not {value!r}")
    return number


def _workers(value: str) -> int | str:
    """``--workers``: "auto" or a count >= 0."""
    return value if value == "auto" else _whole(value, 0, what="'auto' or a count")


def _positive(value: str) -> int:
    """A count >= 1 (``--batch-size``, ``--epochs``, ...)."""
    return _whole(value, 1)


def _count(value: str) -> int:
    """A count >= 0 (``--max-batches``: 0 is no cap)."""
    return _whole(value, 0)


def _quality(value: str) -> int:
    """A JPEG quality, 1..100."""
    return _whole(value, 1, 100, "a JPEG quality")


def _megabytes(value: str) -> float:
    """A size in MB > 0."""
    try:
        size = float(value)
    except ValueError:
        size = 0.0
    if not size > 0:
        raise argparse.ArgumentTypeError(f"give a size in MB > 0, not {value!r}")
    return size


AUGMENTS = ("train", "eval", "none")


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback of an error",
    )
    p = _Parser(prog="stoker", description="Keep an accelerator fed.", parents=[common])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    demo = add("demo", help="make a small photo dataset, train Keras on it, print stats")
    demo.add_argument("--out", default="demo_data", help="folder for the generated dataset")
    demo.add_argument("--epochs", type=_positive, default=2)
    demo.add_argument("--workers", type=_workers, default="auto")
    bench = add("bench", help="measure throughput, the decode ceiling, the bottleneck")
    bench.add_argument("source")
    bench.add_argument("--batch-size", type=_positive, default=256)
    bench.add_argument("--image-size", type=_positive, default=224)
    bench.add_argument("--augment", type=str.lower, choices=AUGMENTS, default="train")
    bench.add_argument("--workers", type=_workers, default="auto")
    bench.add_argument(
        "--epochs", type=_positive, default=3, help="measured epochs after a warm-up"
    )
    bench.add_argument("--max-batches", type=_count, default=0, help="cap batches per epoch")
    bench.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help="also draw img/s over time and the wait share beside the ceiling",
    )
    inspect = add("inspect", help="counts, classes, image sizes, bad files")
    inspect.add_argument("source")
    inspect.add_argument("--decode", action="store_true", help="fully decode every image")
    show = add("show", help="a contact sheet of augmented samples with their labels or masks")
    show.add_argument("source")
    show.add_argument("--out", required=True, metavar="SHEET.png", help="the PNG to write")
    show.add_argument("--augment", type=str.lower, choices=AUGMENTS, default="train")
    show.add_argument("--image-size", type=int, default=128)  # show() names the flag
    show.add_argument("--rows", type=int, default=4)
    show.add_argument("--cols", type=int, default=4)
    show.add_argument("--seed", type=int, default=0)
    doctor = add("doctor", help="shared memory, leaked segments, decoders")
    doctor.add_argument("--clean", action="store_true", help="remove segments of dead processes")
    conv = add("convert", help="write a source as Parquet shards (resumable)")
    conv.add_argument("src", help="any stoker source: image folder, CSV, .npy, tar, HDF5...")
    conv.add_argument("dst", help="folder for the shards, errors.csv and the manifest")
    conv.add_argument("--max-side", type=_positive, default=None, help="shrink sides above N px")
    conv.add_argument("--quality", type=_quality, default=None, help="re-encode as JPEG at Q")
    conv.add_argument("--workers", type=_positive, default=1, help="processes writing shards")
    conv.add_argument("--shard-mb", type=_megabytes, default=256, help="target shard size in MB")
    conv.add_argument("--row-group-mb", type=_megabytes, default=4, help="row group size in MB")
    conv.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        help="store samples in a seeded random order (for block shuffling)",
    )
    conv.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local processes, or Ray tasks (needs stoker[ray])",
    )
    conv.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join with --engine ray (default: a local one)",
    )
    conv.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        with plain_warnings(args.command, args):
            _run(args)
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        print(f"stoker {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line, unless --debug
        if getattr(args, "debug", False):
            raise
        print(f"stoker {args.command}: error: {plain(exc, args)}", file=sys.stderr)
        return 1
    return 0


def _run(args: argparse.Namespace) -> None:
    """Run the subcommand ``args`` names."""
    if args.command == "demo":
        from .demo import run_demo

        run_demo(args.out, epochs=args.epochs, workers=args.workers)
    elif args.command == "bench":
        from .bench import run_bench

        run_bench(
            args.source,
            batch_size=args.batch_size,
            image_size=args.image_size,
            augment=None if args.augment == "none" else args.augment,
            workers=args.workers,
            progress=_progress,
            epochs=args.epochs,
            max_batches=args.max_batches,
            plot=args.plot,
            on_report=_report,
        )
        if args.plot is not None:
            print(f"  plot: {args.plot}")
    elif args.command == "show":
        from .show import show

        augment = None if args.augment == "none" else args.augment
        print(
            show(
                args.source,
                args.out,
                rows=args.rows,
                cols=args.cols,
                image_size=args.image_size,
                augment=augment,
                seed=args.seed,
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


def _report(text: str) -> None:
    """A measured report, on stdout at once (before a chart that may fail is drawn)."""
    print(text, flush=True)


def _progress(line: str) -> None:
    """Progress of a long measurement, on stderr (stdout keeps only the report)."""
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
