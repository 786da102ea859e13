"""checkpoint_no_grad: blog #1824's own remedy, in the reporter's order (a grade must accept it).

https://github.com/huggingface/blog/issues/1824 (yao-matrix, 2024-02-19): transformers upgraded to 4.37.2 and, in the
blog's `get_lora_model`, `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})`
before `model = get_peft_model(model, peft_config)`; the Trainer's `gradient_checkpointing=True` left as it was.

In the case's terms: the case's `make_inputs` has already injected the adapters (what get_peft_model's LoraModel does,
independent of checkpointing); `case.peft_model_init` is the step of get_peft_model that depends on when it runs
(PeftModel.__init__: `enable_input_require_grads()` if the model is already checkpointing). Run after checkpointing
is on, it hooks the word embeddings; the Trainer's step then enables checkpointing again with its empty kwargs
(reentrant), and the hook keeps the LoRA gradients.
"""

from cases import checkpoint_no_grad as case


def reporter_order(x):
    """get_lora_model as #1824 changed it (checkpointing on, use_reentrant False, then the wrapping), then Trainer.train()."""
    x.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    case.peft_model_init(x.model)  # get_peft_model, wrapping a model that is already checkpointing: the input hook
    try:
        return case.trainer_step(x)  # TrainingArguments(gradient_checkpointing=True): reentrant again, the hook stays
    finally:
        x.model.disable_input_require_grads()
