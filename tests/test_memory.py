"""Memory stays flat: 20 epochs keep the process tree's PSS within 5% of the second epoch's."""

import gc

import pytest

import stoker
from stoker.cli.bench import tree_pss


@pytest.mark.timeout(120)
def test_pss_is_flat_across_20_epochs(image_folder):
    sizes = []
    with stoker.Loader(image_folder, batch_size=6, image_size=96, workers=2) as loader:
        for _ in range(20):
            for x, _y in loader:
                x.sum()  # touch the batch like a consumer would
            gc.collect()
            sizes.append(tree_pss())
        assert loader.stats().batches == 20 * len(loader)
    growth = (max(sizes[2:]) - sizes[1]) / sizes[1]
    assert growth < 0.05, [f"{s / 2**20:.1f} MiB" for s in sizes]
