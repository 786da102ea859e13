"""Upstream's fixes of backward_twice, each as a submission: the tutorial's own line, which its maintainer pointed the
reporter back to, and the reporter's workaround from the thread.

https://github.com/MorvanZhou/PyTorch-Tutorial/issues/57: the reporter commented out `h_state = h_state.data`, got
"Trying to backward through the graph a second time", and "found the error can actually be solved by
`loss.backward(retain_graph=True)`"; the maintainer (MorvanZhou): "which version of the pytorch are you using? This
code is based on pytorch=0.4". No code changed upstream for the thread: the fix is the line the tutorial already had.
"""

import torch.nn as nn

from cases.backward_twice import next_window, trained


def tutorial_h_state_data(x):
    """tutorial-contents/403_RNN_regressor.py of MorvanZhou/PyTorch-Tutorial as #57 found it (commit 818b4b4,
    2018-11-13; the line since commit 921b69a, "update to torch 0.4"), pointed to by the maintainer in
    https://github.com/MorvanZhou/PyTorch-Tutorial/issues/57: right after the forward,
    `h_state = h_state.data  # repack the hidden state, break the connection from last iteration`."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, h_state = x.model(inputs, x.h_state)  # rnn output
        # !! next step is important !!
        x.h_state = h_state.data  # repack the hidden state, break the connection from last iteration
        loss = nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward()
        x.optimizer.step()
        predictions.append(prediction)
    return trained(x, predictions)


def thread_retain_graph(x):
    """The reporter's workaround in https://github.com/MorvanZhou/PyTorch-Tutorial/issues/57, not the maintainer's:
    the line left commented out and `loss.backward(retain_graph=True)`."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, x.h_state = x.model(inputs, x.h_state)
        loss = nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward(retain_graph=True)
        x.optimizer.step()
        predictions.append(prediction)
    return trained(x, predictions)
