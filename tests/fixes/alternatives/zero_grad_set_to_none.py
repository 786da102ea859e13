"""zero_grad_set_to_none: an alternative correct fix, written differently from the case's own `fixed`."""

import torch

from cases.zero_grad_set_to_none import BatchUpdateParameterServer, train, zero_grad_by_default


class SumsApart(BatchUpdateParameterServer):
    """The server keeps its own running sums, apart from `.grad`, and hands the optimizer their mean at the step:
    `zero_grad()` may leave `.grad` as None or as zeros (any torch), nothing reads it between rounds."""

    def __init__(self, model, batch_update_size, lr, momentum, zero_grad):
        super().__init__(model, batch_update_size, lr, momentum, zero_grad)
        self.sums = [torch.zeros_like(p) for p in self.model.parameters()]

    def update_and_fetch_model(self, grads):
        for total, g in zip(self.sums, grads):
            total.add_(g)
        self.curr_update_size += 1
        if self.curr_update_size >= self.batch_update_size:
            for p, total in zip(self.model.parameters(), self.sums):
                p.grad = total / self.batch_update_size
                total.zero_()
            self.curr_update_size = 0
            self.optimizer.step()
            self.zero_grad(self)  # torch's default zero_grad(), None or zeros: nothing reads `.grad` before the next step
        return self.model


def zero_grad_set_to_none(x):
    return train(x, zero_grad_by_default, SumsApart)
