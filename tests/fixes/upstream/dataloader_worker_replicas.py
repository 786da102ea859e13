"""Upstream's workaround for dataloader_worker_replicas as a submission.

https://github.com/wolny/pytorch-3dunet/issues/32 got no fix: the maintainer (wolny, 2019-11-11) answered "It's by
design that workers return the same sequence of random numbers, since the workers share the common instance of the
`Dataset` which was initialized with a fixed seed", and pytorch-3dunet's history (read here) changed nothing for it
after. What the thread does give is the reporter's workaround; graded as written. The loader and the dataset are the
case's (`epoch`, the dataset in the inputs). Graded by tests/test_upstream_fixes.py; the grades are in
docs/history/upstream_fixes.md.
"""

from dataclasses import replace

from cases.dataloader_worker_replicas import epoch


def issue_32_num_workers_0(x):
    """The reporter's words in https://github.com/wolny/pytorch-3dunet/issues/32 (2019-07-02): "When I set num_workers
    in configuration files to 0, transformers work just fine." The same loader with `num_workers: 0`: every patch read
    and augmented in the main process, from the dataset `get_train_loaders` built."""
    return epoch(replace(x, workers=0))
