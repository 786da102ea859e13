"""Upstream's fixes of tied_weights_meta_init as submissions, in the order upstream applied them.

The model, its build on meta, `init_weights`' modules and the training are the case's (`on_meta`, `initialise`,
`train`); only what re-ties is upstream's, re-typed from the commits read in each repository's history: accelerate
780e4aa3 (#1204) and 8159c98d (#3154), torchtitan 4f5512fb (#2253). Graded by tests/test_upstream_fixes.py; the grades
are in docs/history/upstream_fixes.md.
"""

import torch
from torch import nn

from cases.tied_weights_meta_init import initialise, on_meta, precompute_rope_cache, train


def find_tied_parameters(model, **kwargs):
    """accelerate's `find_tied_parameters` as #1204 called it (src/accelerate/utils/modeling.py at 780e4aa3): a
    parameter that a submodule holds under a name the deduplicated `named_parameters` of the whole model lacks is tied
    to the name it is found under there; {first name: tied name}."""
    named_parameters = kwargs.get("named_parameters", None)
    prefix = kwargs.get("prefix", "")
    result = kwargs.get("result", {})
    if named_parameters is None:
        named_parameters = {n: p for n, p in model.named_parameters()}
    else:
        for name, parameter in model.named_parameters():
            full_name = name if prefix == "" else f"{prefix}.{name}"
            if full_name not in named_parameters:
                for new_name, new_param in named_parameters.items():
                    if new_param is parameter:
                        result[new_name] = full_name
    for name, child in model.named_children():
        child_name = name if prefix == "" else f"{prefix}.{name}"
        find_tied_parameters(child, named_parameters=named_parameters, prefix=child_name, result=result)
    return result


def retie_parameters(model, tied_params):
    """accelerate's `retie_parameters` (modeling.py at 780e4aa3), verbatim: each tied name set to its first name's
    parameter."""
    for param_name, tied_param_name in tied_params.items():
        param = model
        for split in param_name.split("."):
            param = getattr(param, split)
        tied_module = model
        for split in tied_param_name.split(".")[:-1]:
            tied_module = getattr(tied_module, split)
        setattr(tied_module, tied_param_name.split(".")[-1], param)


def accelerate_pr_1204_retie_parameters(x):
    """https://github.com/huggingface/accelerate/pull/1204 (commit 780e4aa3, "Fix tied weights load", 2023-03-16):
    `load_checkpoint_in_model` starts with `tied_params = find_tied_parameters(model)` and ends with
    `retie_parameters(model, tied_params)`; here around the step that breaks the tie, `to_empty`."""
    model = on_meta(x)
    tied_params = find_tied_parameters(model)
    model.to_empty(device=x.device)
    retie_parameters(model, tied_params)
    return train(initialise(model, x), x)


def ensure_weights_retied(param_init_fn, model, device):
    """accelerate's `ensure_weights_retied` (#3154, src/accelerate/utils/fsdp_utils.py at 8159c98d), verbatim but for
    `defaultdict` spelled out: `param_init_fn` wrapped so that a module's parameters that were tied on meta are tied
    again to the first one materialised."""
    _tied_names = model._tied_weights_keys
    if not _tied_names:
        return param_init_fn
    _tied_params = {}
    for name in _tied_names:
        name = name.split(".")
        name, param_name = ".".join(name[:-1]), name[-1]
        mod = model.get_submodule(name)
        param = getattr(mod, param_name)
        _tied_params[id(param)] = None

    def param_init_fn_tied_param(module):
        params_to_tie = {}
        for n, param in module.named_parameters(recurse=False):
            if id(param) in _tied_params:
                params_to_tie.setdefault(id(param), []).append(n)
        module = param_init_fn(module)
        for id_key, _param_names in params_to_tie.items():
            for param_name in _param_names:
                param = _tied_params[id_key]
                if param is None:
                    _tied_params[id_key] = getattr(module, param_name)
                else:
                    setattr(module, param_name, param)
        return module

    return param_init_fn_tied_param


def accelerate_pr_3154_retie_after_param_init(x):
    """https://github.com/huggingface/accelerate/pull/3154 (commit 8159c98d, "Models With Tied Weights Need Re-Tieing
    After FSDP Param Init", 2024-10-31): the FSDP plugin's `param_init_fn` wrapped by `ensure_weights_retied`. FSDP
    calls it module by module; the thread's `param_init_fn = lambda x: x.to_empty(device=device, recurse=False)`. The
    tied names come from `model._tied_weights_keys`, an attribute of transformers' models (their LM heads'
    `["lm_head.weight"]`) that torchtitan's model lacks: set here as a transformers model declares it."""
    model = on_meta(x)
    model._tied_weights_keys = ["output.weight"]
    init = ensure_weights_retied(lambda module: module.to_empty(device=x.device, recurse=False), model, x.device)
    for module in list(model.modules()):
        init(module)
    return train(initialise(model, x), x)


def _init_weights_pr_2253(model, buffer_device):
    """torchtitan's `init_weights` after #2253 (the case's `Transformer.init_weights` up to the head): with weight
    tying, `self.output.weight = self.tok_embeddings.weight` ("since when the model is initialized on meta device, the
    tying in the __init__ may not have worked correctly we ensure the weights are tied here") in place of the head's
    truncated normal init."""
    with torch.device(buffer_device):
        model.rope_cache = precompute_rope_cache(model.args.head_dim, model.args.max_seq_len, model.args.rope_theta)
    nn.init.normal_(model.tok_embeddings.weight)
    for layer in model.layers.values():
        layer.init_weights()
    model.norm.reset_parameters()
    assert model.tok_embeddings is not None and model.output is not None
    model.output.weight = model.tok_embeddings.weight


def torchtitan_pr_2253_tie_in_init_weights(x):
    """https://github.com/pytorch/torchtitan/pull/2253 (commit 4f5512fb, "weight tying fix for qwen3", 2026-01-26, for
    https://github.com/pytorch/torchtitan/issues/2252), as merged: the tie moved from `parallelize_qwen3` into the
    model's `__init__` (on meta here, as `on_meta` ties), and `init_weights` ties again at its end instead of
    initialising the head. Its description's `F.linear` on `tok_embeddings.weight` is not in the merged diff."""
    model = on_meta(x)
    model.to_empty(device=x.device)
    torch.manual_seed(x.seed)
    with torch.no_grad():
        _init_weights_pr_2253(model, x.device)
    return train(model, x)
