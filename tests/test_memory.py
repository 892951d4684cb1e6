"""Memory stays flat: 20 epochs keep the memory the loader's process tree owns within 5% of the
second epoch's.

"Owns" is the proportional share of anonymous memory (heaps, stacks) and of shared memory (the
batch ring) over the loader's process and its workers (``Pss_Anon + Pss_Shmem`` of
``/proc/PID/smaps_rollup``). Plain PSS also counts a share of the library code every Python
process on the machine maps (libpython, numpy, OpenCV): on a busy machine that share jumps by
several MiB whenever another program starts or exits, which no leak of ours can cause.
"""

import gc
import mmap

import psutil
import pytest

import stoker


def _owned(pid: int) -> int:
    """Bytes of anonymous + shared memory (proportional share) that process ``pid`` maps."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Pss_Anon", "Pss_Shmem"):
                fields[key] = int(rest.split()[0]) * 1024
    assert len(fields) == 2, f"/proc/{pid}/smaps_rollup lacks Pss_Anon/Pss_Shmem"
    return sum(fields.values())


def tree_owned() -> int:
    """``_owned`` summed over this process and its descendants."""
    total = 0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += _owned(proc.pid)
        except (FileNotFoundError, ProcessLookupError, psutil.Error):
            continue  # a process that exited between the listing and the read
    return total


@pytest.mark.timeout(120)
def test_memory_is_flat_across_20_epochs(image_folder):
    sizes = []
    with stoker.Loader(image_folder, batch_size=6, image_size=96, workers=2) as loader:
        for _ in range(20):
            for x, _y in loader:
                x.sum()  # touch the batch like a consumer would
            gc.collect()
            sizes.append(tree_owned())
        assert loader.stats().batches == 20 * len(loader)
    growth = (max(sizes[2:]) - sizes[1]) / sizes[1]
    assert growth < 0.05, [f"{s / 2**20:.1f} MiB" for s in sizes]


def test_a_leak_would_show(image_folder):
    """The measure sees memory the process really holds (what the test above guards)."""
    before = tree_owned()
    # a fresh mapping, never the heap: malloc may hand back pages an earlier test touched and
    # freed (glibc keeps them below its trim threshold), which would add nothing here
    held = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, len(held), mmap.PAGESIZE):  # touch every page
        held[offset] = 1
    assert tree_owned() - before > 30 << 20
    held.close()
