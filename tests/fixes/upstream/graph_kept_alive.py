"""The threads' fixes of graph_kept_alive, each as a submission. zoogzog/chexnet's code was never changed and no
maintainer answered either thread; what the threads offer is graded.

Each is ChexnetTrainer.epochVal's batch as the case writes it (`Validation.next_batch`, `running_means`, the
module's BCELoss, which the buggy code uses too), with the thread's change. tests/test_upstream_fixes.py grades
them; docs/history/upstream_fixes.md has the verdicts.
"""

import torch

from cases.graph_kept_alive import loss, running_means


def issue_19_no_grad(x):
    """dgrechka, a commenter, in https://github.com/zoogzog/chexnet/issues/19: the code was written for torch 0.3.1, and
    `with torch.no_grad():` in place of `volatile=True` "solved the issue": epochVal's forward and loss under no_grad."""
    input, target = x.next_batch()
    with torch.no_grad():
        varOutput = x.network(input)
        losstensor = loss(varOutput, target)
    x.epoch.losstensorMean += losstensor
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


def issue_12_data_index(x):
    """A user in https://github.com/zoogzog/chexnet/issues/12 blames the running sum and suggests
    `losstensorMean += losstensor.data[0]` (torch 0.3's way to take the loss's value)."""
    input, target = x.next_batch()
    varOutput = x.network(input)
    losstensor = loss(varOutput, target)
    x.epoch.losstensorMean += losstensor.data[0]
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


def issue_12_item(x):
    """#12's suggestion as torch >= 0.4 spells it, `losstensorMean += losstensor.item()`, which #19's reporter tried
    (https://github.com/zoogzog/chexnet/issues/12, 2019-05-29: "Adding [0] or .item() does not work either"): the sum
    keeps no graph, each batch still records one. The sum stays a tensor, as epochVal's `losstensorMean` is."""
    input, target = x.next_batch()
    varOutput = x.network(input)
    losstensor = loss(varOutput, target)
    x.epoch.losstensorMean += torch.tensor(losstensor.item(), device=losstensor.device)
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)
