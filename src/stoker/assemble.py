"""Fill one batch: take the epoch's order slice, read, decode and transform each sample into
the batch arrays, replacing bad samples deterministically. Runs in workers and inline alike."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import order as order_mod
from . import seeding
from ._compat import add_note
from .batchfn import BatchTransform, batch_rng
from .errors import DATA_ERRORS, TooManyErrors, one_line
from .order import Plan
from .schema import Columns
from .sources import fetch
from .sources.base import LoadsFields, Source, Takes
from .sources.fetch import RequestCounts
from .sources.readahead import PLAN_AHEAD, ReadAhead, ReadSettings, size_of
from .transforms import PipelineSpec

MAX_REPLACEMENT_TRIES = 64
# A worker's status[0] (the sample it loads) while the batch_transform runs on a filled batch
IN_BATCH_TRANSFORM = -2


@dataclass
class Report:
    """What filling one batch produced: its size, the bad samples met, and stage timings."""

    count: int = 0
    bad: list[tuple[int, str, str]] = field(default_factory=list)
    #: (index, name, message) of samples that decoded despite recoverable corrupt data
    #: (libjpeg warnings): kept, not replaced, and reported apart from the bad ones.
    warned: list[tuple[int, str, str]] = field(default_factory=list)
    #: Seconds waiting for a sample's bytes (with read-ahead: only what the window did not hide).
    read_s: float = 0.0
    decode_s: float = 0.0
    transform_s: float = 0.0
    #: Bytes read from the source (images and masks).
    read_bytes: int = 0
    #: Samples whose file pages were dropped from the page cache after reading (page_cache).
    pages_dropped: int = 0
    #: In a worker: seconds it waited for this task after its previous one (idle for lack of
    #: work), and seconds the fill took; the prefetch engine sizes the ring from them.
    idle_s: float = 0.0
    fill_s: float = 0.0
    #: What the process's requests to remote storage cost while it filled this batch.
    requests: RequestCounts = field(default_factory=RequestCounts)


class Assembler:
    """Fills batches for one process; keeps the current epoch's order cached. Its live
    pipeline is built here, in the process that uses it, from the Recipe's frozen spec."""

    def __init__(
        self,
        source: Source,
        spec: PipelineSpec,
        plan: Plan,
        columns: Columns | None = None,
        read_settings: ReadSettings | None = None,
        batch_fn: BatchTransform | None = None,
    ) -> None:
        self.source, self.pipeline, self.plan = source, spec.build(), plan
        self.batch_fn = batch_fn
        self.columns = columns if columns is not None else Columns({"label": source.labels})
        self.reader = ReadAhead(source, read_settings)  # the live read-ahead window
        fetch.fetcher().take_counts()  # the reports count the batches' requests, not the scan's
        self._epoch = -1
        #: user code that loads samples (an augment callable, a dataset): global RNGs seeded
        self._user_code = bool(getattr(self.pipeline, "user_code", False)) or (
            source.sample_fields is not None
        )
        #: the source's bulk copy of a batch's images (``Takes``), when the spec says the
        #: pipeline would copy each of them unchanged; else None
        self._take = None
        if isinstance(source, Takes) and spec.keeps_pixels(
            source.pixel_size(), source.pixel_channels() or 3
        ):
            self._take = source.take
        #: a per-sample dataset's own loading of its fields (``LoadsFields``), else None
        self._fields = source if isinstance(source, LoadsFields) else None
        self._order = np.zeros(0, dtype=np.int64)
        self._global = self._slots = self._order  # the epoch's global order, this rank's slots
        self._following = (-1, self._order)  # the next epoch's first samples, read ahead into
        self.current = -1  # index of the sample being loaded, for crash reports

    def order(self, epoch: int) -> np.ndarray:
        """The (cached) order of ``epoch``."""
        if epoch != self._epoch:
            self._global, self._slots = self.plan.global_order(epoch), self.plan.slots(epoch)
            self._order, self._epoch = self.plan.order(epoch), epoch
            self.reader.plan_epoch(self._order, lambda: self.plan.order(epoch + 1))
        return self._order

    def _ahead(self, epoch: int, at: int) -> np.ndarray:
        """The samples of the ``PLAN_AHEAD`` batches after position ``at`` of ``epoch``, read
        ahead of decoding: within the epoch's batches (drop_last leaves a tail out), then the
        next epoch's first ones, so its first batches do not wait for their reads. The next
        epoch's order is a hint only, never the order it is filled in (an ``exclude()`` may
        still change it)."""
        order, want = self.order(epoch), PLAN_AHEAD * self.plan.batch_size
        last = min(len(order), self.plan.epoch_batches(epoch) * self.plan.batch_size)
        ahead = order[at : min(last, at + want)]
        if len(ahead) == want:
            return ahead
        if self._following[0] != epoch + 1:  # its head only: no second order held
            self._following = (epoch + 1, self.plan.order(epoch + 1)[:want].copy())
        return np.concatenate([ahead, self._following[1][: want - len(ahead)]])

    def fill(
        self,
        epoch: int,
        batch: int,
        arrays: dict[str, np.ndarray],
        status: np.ndarray | None = None,
    ) -> Report:
        """Write batch ``batch`` of ``epoch`` into ``arrays`` (a slot's fields); return its report.

        ``image`` (and ``mask``, which gets its image's crop and flip) come from the pipeline,
        ``index`` is the sample's index in the source the user passed (``source.origin()``:
        before any split or class selection), and every column (``label``, ``weight``, ...) is
        copied with its dtype and shape; then the ``batch_transform`` runs on the whole batch."""
        target = arrays
        if self.batch_fn is not None:  # fields it changes are filled apart, then replaced
            arrays = self.batch_fn.scratch(target, self.plan.batch_size)
        order = self.order(epoch)
        start = batch * self.plan.batch_size
        positions = np.arange(start, min(start + self.plan.batch_size, len(order)))
        indices = order[positions]
        u = order_mod.sample_uniforms(self.plan.seed, epoch, indices, self.pipeline.uniforms)
        report = Report(count=len(indices))
        self.reader.start(indices, self._ahead(epoch, start + len(indices)))
        masks = arrays.get("mask")
        columns = self.columns.items()
        dropped = self.reader.counters.dropped
        own = [f[0] for f in self.source.sample_fields or ()]
        n = len(indices)
        if self._bulk(indices, arrays, report):
            chosen = indices  # in-memory arrays, copied as they are: nothing can fail
        else:
            chosen = np.empty(n, dtype=np.int64)
            with seeding.user_states_kept(self._user_code):  # saved once, not per sample
                for slot, pos in enumerate(positions):
                    if own:  # a per-sample dataset writes its own fields
                        out: Any = {name: arrays[name][slot, ...] for name in own}  # 0-d views
                    else:
                        out = (arrays["image"][slot], None if masks is None else masks[slot])
                    chosen[slot] = self._load_good(epoch, int(pos), out, u[slot], report, status)
        arrays["index"][:n] = self.source.source_indices(chosen)  # numbered as the user's source
        for name, column in columns:
            arrays[name][:n] = column[chosen]
        report.pages_dropped = self.reader.counters.dropped - dropped
        report.requests = fetch.fetcher().take_counts()
        if self.batch_fn is not None:
            self._batch_transform(epoch, batch, arrays, target, report, status)
        return report

    def _batch_transform(
        self,
        epoch: int,
        batch: int,
        arrays: dict[str, np.ndarray],
        target: dict[str, np.ndarray],
        report: Report,
        status: np.ndarray | None,
    ) -> None:
        """Run the ``batch_transform`` on the filled batch, with its batch's generator; what it
        returns goes into ``target`` (the slot). While it runs, ``status`` says so
        (``IN_BATCH_TRANSFORM``): a hang or a death then is the function's, not a sample's."""
        assert self.batch_fn is not None
        self.current = -1  # an error here is the function's, not the last sample's
        last = int(status[0]) if status is not None else -1
        if status is not None:
            status[0] = IN_BATCH_TRANSFORM
        t0 = time.perf_counter()
        rng = batch_rng(self.plan.seed, epoch, self.plan.first_step(epoch) + batch)
        try:
            self.batch_fn.apply(arrays, target, report.count, rng)
        except Exception as exc:
            add_note(exc, f"stoker: raised by batch_transform on batch {batch} of epoch {epoch}")
            raise
        if status is not None:
            status[0] = last
        report.transform_s += time.perf_counter() - t0

    def _bulk(self, indices: np.ndarray, arrays: dict[str, np.ndarray], report: Report) -> bool:
        """Copy a whole batch of an in-memory array source at once, when the pipeline would
        copy each image unchanged (``PipelineSpec.keeps_pixels``) and the source can."""
        if self._take is None:
            return False
        t0 = time.perf_counter()
        if not self._take(indices, arrays["image"][: len(indices)]):
            return False
        report.transform_s += time.perf_counter() - t0
        return True

    @property
    def copies_whole(self) -> bool:
        """Whether a batch of images is copied whole from the source (``_bulk``), the pipeline
        keeping their pixels as they are."""
        return self._take is not None

    def _load_good(self, epoch, pos, out, u, report, status) -> int:
        """Load the sample at ``pos`` of this rank's order; on bad data, the next good one
        after it in the epoch's *global* order, so the replacement is the same on any number
        of ranks (it may be a sample another rank also loads in this step)."""
        order, slot = self._global, int(self._slots[pos])
        tries = min(MAX_REPLACEMENT_TRIES, len(order))
        first_bad = len(report.bad)
        for k in range(tries):
            index = int(order[(slot + k) % len(order)])
            if k:
                u = order_mod.sample_uniforms(
                    self.plan.seed, epoch, np.array([index]), self.pipeline.uniforms
                )[0]
            if status is not None:
                status[0] = index
            self.current = index
            if self.load_one(epoch, index, out, u, report):
                return index
        raise _all_failed(report.bad[first_bad:], tries == len(order))

    def load_one(
        self,
        epoch: int,
        index: int,
        out: tuple[np.ndarray, np.ndarray | None],
        u: np.ndarray,
        report: Report,
    ) -> bool:
        """Load one sample (and its mask) into ``out``; False (and a note in ``report``) if its
        data is bad."""
        if isinstance(out, dict):
            return self._load_fields(epoch, index, out, report)
        image_out, mask_out = out
        notes: list[str] = []
        t0 = time.perf_counter()
        try:
            data, mask = self.reader.take(index)
            t1 = time.perf_counter()
            if mask_out is not None:
                region, mask_region = self.pipeline.load_pair(data, mask, u, notes)
                if self.pipeline.mask_map is not None:  # values mapped once, before geometry
                    mask_region = self.pipeline.mask_map.apply(mask_region)
            else:
                region = self.pipeline.load(data, u, notes)
        except DATA_ERRORS as exc:
            report.bad.append((index, self._name(index, mask_out), one_line(exc)))
            return False
        except Exception as exc:
            add_note(exc, f"stoker: raised while loading {self._name(index, mask_out)}")
            raise
        if notes:
            report.warned.append((index, self._name(index, mask_out), "; ".join(notes)))
        t2 = time.perf_counter()
        rng = self._rng(epoch, index)
        if mask_out is not None:
            self.pipeline.write_pair(region, mask_region, u, rng, image_out, mask_out)
        else:
            self.pipeline.write(region, u, rng, image_out)
        report.read_s += t1 - t0
        report.read_bytes += size_of(data) + (size_of(mask) if mask_out is not None else 0)
        report.decode_s += t2 - t1
        report.transform_s += time.perf_counter() - t2
        return True

    def _load_fields(
        self, epoch: int, index: int, out: dict[str, np.ndarray], report: Report
    ) -> bool:
        """A per-sample dataset's sample into ``out``; any exception its ``__getitem__``
        raises makes the sample bad (counted against max_errors, named, replaced)."""
        t0 = time.perf_counter()
        rng = order_mod.sample_generator(self.plan.seed, epoch, index)
        assert self._fields is not None  # batches of fields come from a LoadsFields source
        try:
            self._fields.load(index, rng, out)
        except Exception as exc:  # noqa: BLE001 - the budget decides; past it, TooManyErrors
            report.bad.append((index, self.source.name(index), one_line(exc)))
            return False
        report.read_s += time.perf_counter() - t0
        return True

    def _name(self, index: int, mask_out: np.ndarray | None) -> str:
        """The sample's file name (and its mask's, for a source with masks)."""
        name = self.source.name(index)
        if mask_out is not None:
            name = f"{name} (mask {self.source.mask_name(index)})"
        return name

    def _rng(self, epoch: int, index: int) -> Any:
        if not self.pipeline.needs_rng:
            return None
        return order_mod.sample_generator(self.plan.seed, epoch, index)


def _all_failed(bad: list[tuple[int, str, str]], whole_epoch: bool) -> TooManyErrors:
    """The error for a batch position where no sample loads: it names the files and reasons,
    and carries them (``.bad``) so the loader's stats() count them as skipped."""
    listed = "\n".join(f"  {name}: {reason}" for _, name, reason in bad[:10])
    more = f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""
    if whole_epoch and len(bad) == 1:
        head = "the only sample failed to load"
    elif whole_epoch:
        head = f"all {len(bad)} samples failed to load"
    else:
        head = f"{len(bad)} samples in a row failed to load"
    exc = TooManyErrors(f"{head}:\n{listed}{more}\nfix or remove these files")
    exc.bad = list(bad)  # type: ignore[attr-defined]
    return exc
