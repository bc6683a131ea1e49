"""DeviceAdamW: AdamW, gradient clipping, EMA, the LR schedule and the fp16 loss scale on the device.

The C++ trainer's optimizer (src/ops/multi_tensor_adamw.h) for a Python training loop: one step is the
multi-tensor AdamW op (`perftrain.ops.multi_tensor_adamw_`: three multi-tensor launches on a GPU) over
every parameter, with the global gradient norm, clipping, the LR of the schedule, the dynamic loss scale
and the EMA all computed on the device from a small float32 `scalars` tensor there. step() reads nothing
back to the host and allocates nothing, so it runs inside `perftrain.capture_step`'s CUDA graph.

The parameters are the fp32 master weights. With `compute_dtype=torch.bfloat16` (given the model, not a
parameter list) the optimizer also keeps a bf16 copy of each parameter, rewritten by every step, which the
products of the model's perftrain.nn layers read in place of casting the fp32 weight each forward (the
gradient still reaches the fp32 weight).
"""
import torch

from . import ops

__all__ = ["DeviceAdamW"]

LR_SHAPES = ("constant", "cosine", "linear", "wsd")


def _check(cond, key, msg):
    if not cond:
        raise ValueError(f"DeviceAdamW: {key}: {msg}")


def _unwrapped(module):
    """The model inside DistributedDataParallel, DataParallel and torch.compile's wrapper (whose parameter
    names carry a `module.` or `_orig_mod.` prefix that the model's own state dict does not), any nesting."""
    while True:
        if isinstance(module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            module = module.module
        elif isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):
            module = module._orig_mod
        else:
            return module


def _named_trainable(params):
    """-> [(name, parameter)] of what requires a gradient: from a module (its names), or an iterable of
    tensors or of parameter groups ({"params": [...], "weight_decay": w}) -> also the per-tensor decay flags
    (None: the optimizer's weight_decay for every tensor)."""
    if isinstance(params, torch.nn.Module):
        return [(n, p) for n, p in params.named_parameters() if p.requires_grad], None
    items = list(params)
    if items and isinstance(items[0], dict):
        named, decay = [], []
        for gi, group in enumerate(items):
            unknown = set(group) - {"params", "weight_decay"}
            _check(not unknown, f"param group {gi}", f"unknown keys {sorted(unknown)} (params, weight_decay)")
            wd = group.get("weight_decay")
            for i, p in enumerate(group["params"]):
                if p.requires_grad:
                    named.append((f"group{gi}.{i}", p))
                    decay.append(wd)
        return named, decay
    return [(str(i), p) for i, p in enumerate(items) if p.requires_grad], None


def _check_params(named):
    _check(len(named) > 0, "params", "no parameter requires a gradient")
    devices = {p.device for _, p in named}
    _check(len(devices) == 1, "params", f"on more than one device: {sorted(map(str, devices))}")
    for name, p in named:
        _check(p.dtype == torch.float32, "params", f"{name} is {p.dtype}; the master weights are float32")
        _check(p.is_contiguous(), "params", f"{name} is not contiguous")


def _check_options(lr, betas, eps, weight_decay, warmup_steps, lr_schedule, lr_min, total_steps, grad_clip,
                   ema_decay, loss_scale, compute_dtype, from_module):
    _check(lr > 0, "lr", f"must be > 0, got {lr}")
    _check(0 <= betas[0] < 1 and 0 <= betas[1] < 1, "betas", f"each in [0, 1), got {betas}")
    _check(eps > 0, "eps", f"must be > 0, got {eps}")
    _check(weight_decay >= 0, "weight_decay", f"must be >= 0, got {weight_decay}")
    _check(lr_schedule in LR_SHAPES, "lr_schedule", f"{lr_schedule!r} is not one of {', '.join(LR_SHAPES)}")
    _check(warmup_steps >= 0 and total_steps >= 0, "warmup_steps/total_steps", "must be >= 0")
    _check(lr_schedule == "constant" or total_steps > 0, "total_steps", f"{lr_schedule} needs total_steps > 0")
    _check(0 <= lr_min <= lr, "lr_min", f"must be in [0, lr], got {lr_min}")
    _check(grad_clip >= 0, "grad_clip", f"must be >= 0 (0: off), got {grad_clip}")
    _check(ema_decay is None or 0 <= ema_decay < 1, "ema_decay", f"must be in [0, 1) or None, got {ema_decay}")
    _check(loss_scale is None or loss_scale == "dynamic" or
           (isinstance(loss_scale, (int, float)) and loss_scale > 0), "loss_scale",
           f"None, a number > 0 or 'dynamic', got {loss_scale!r}")
    _check(compute_dtype in (None, torch.bfloat16), "compute_dtype",
           f"None or torch.bfloat16 (the copies the optimizer op writes), got {compute_dtype}")
    _check(compute_dtype is None or from_module, "compute_dtype",
           "the weight copies need the model (DeviceAdamW(model, ...)) to attach them to its layers")


class _Slot:
    """A read-only attribute: the optimizer's scalars slot `name` (perftrain.ops.ADAMW_SLOTS), a 0-d view."""

    def __init__(self, name, doc):
        self.name, self.__doc__ = name, doc

    def __get__(self, opt, owner=None):
        return self if opt is None else opt.scalars[ops.ADAMW_SLOTS[self.name]]


def _indices_by_shape(params):
    """{(shape, device): [indices of params of that shape on that device, in order]}, in order of first use."""
    groups = {}
    for i, p in enumerate(params):
        groups.setdefault((tuple(p.shape), p.device), []).append(i)
    return groups


class DeviceAdamW:
    """AdamW over fp32 parameters with everything per step on the device.

    params: a module (its trainable parameters, by name; needed for the bf16 copies and ema_state_dict;
    the model inside a DistributedDataParallel, DataParallel or torch.compile wrapper is taken by its own names),
    parameters, or groups {"params": [...], "weight_decay": w} where w is 0 or weight_decay.
    lr, betas, eps, weight_decay: torch.optim.AdamW's (decoupled decay, bias correction).
    warmup_steps, lr_schedule ("constant", "cosine", "linear", "wsd"), lr_min, total_steps, decay_fraction:
    the LR of step n (the C++ trainer's schedules, docs/guide/training.md): a linear warm-up from 0 over
    warmup_steps, then the shape down to lr_min at total_steps.
    grad_clip: clip the gradients' global L2 norm to this (0: off). ema_decay: keep an EMA of the weights
    (ema = decay * ema + (1 - decay) * p after each update; None: no EMA), with ema_warmup the decay
    min(ema_decay, (1 + n) / (10 + n)) after n updates.
    loss_scale: None (bf16/fp32: gradients unscaled), a number (a constant scale the gradients carry), or
    "dynamic" (fp16: starts at 2^16, halves and skips the step on inf/NaN, doubles after growth_interval
    finite steps, as torch.amp.GradScaler). Multiply the loss by `opt.loss_scale` before backward.
    compute_dtype: torch.bfloat16 to keep the bf16 weight copies (needs params to be a module).
    """

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, warmup_steps=0,
                 lr_schedule="constant", lr_min=0.0, total_steps=0, decay_fraction=0.2, grad_clip=0.0,
                 ema_decay=None, ema_warmup=False, loss_scale=None, growth_interval=2000, compute_dtype=None):
        if isinstance(params, torch.nn.Module):
            params = _unwrapped(params)
        named, group_decay = _named_trainable(params)
        _check_params(named)
        _check_options(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, warmup_steps=warmup_steps,
                       lr_schedule=lr_schedule, lr_min=lr_min, total_steps=total_steps, grad_clip=grad_clip,
                       ema_decay=ema_decay, loss_scale=loss_scale, compute_dtype=compute_dtype,
                       from_module=isinstance(params, torch.nn.Module))
        if group_decay is not None:
            bad = {w for w in group_decay if w not in (None, 0, 0.0, weight_decay)}
            _check(not bad, "param groups", f"weight_decay {sorted(bad)}: each group takes 0 or weight_decay "
                   f"({weight_decay})")

        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.decay = None if group_decay is None else [w != 0 for w in group_decay]
        self.options = dict(lr=float(lr), betas=(float(betas[0]), float(betas[1])), eps=float(eps),
                            weight_decay=float(weight_decay), warmup_steps=int(warmup_steps),
                            lr_schedule=lr_schedule, lr_min=float(lr_min), total_steps=int(total_steps),
                            decay_fraction=float(decay_fraction), grad_clip=float(grad_clip),
                            ema_decay=0.0 if ema_decay is None else float(ema_decay), ema_warmup=bool(ema_warmup),
                            dynamic_loss_scale=loss_scale == "dynamic", growth_interval=int(growth_interval))
        self.has_ema = ema_decay is not None
        with torch.no_grad():
            self.exp_avgs = [torch.zeros_like(p) for p in self.params]
            self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
            self.emas = [p.detach().clone() for p in self.params] if self.has_ema else []
            initial = 2.0 ** 16 if loss_scale == "dynamic" else float(loss_scale or 1.0)
            self.scalars = ops.adamw_scalars(self.params[0].device, initial)
            self.compute_copies = self._attach_compute_copies(params, compute_dtype)
        self.param_groups = [{"params": self.params, "lr": float(lr), "weight_decay": float(weight_decay)}]

    def _attach_compute_copies(self, model, dtype):
        """One copy in dtype per parameter (the op writes all or none), set as the parameter's
        `_perftrain_compute_copy`, which perftrain.nn's products read (perftrain.nn.compute_weight); the
        model's load_state_dict refreshes them. The copies of parameters of one shape lie back to back in
        one buffer, in parameter order, as the C++ device optimizer lays them out: a product over several
        layers of one shape (ops.stacked_linear: the blocks' adaLN modulations) reads them in place."""
        if dtype is None:
            return []
        copies = [None] * len(self.params)
        for idx in _indices_by_shape(self.params).values():
            first = self.params[idx[0]]
            numel = first.numel()
            flat = torch.empty(numel * len(idx), dtype=dtype, device=first.device)
            for j, i in enumerate(idx):
                copy = flat[j * numel:(j + 1) * numel].view(first.shape)
                copy.copy_(self.params[i].detach())
                self.params[i]._perftrain_compute_copy = copy
                copies[i] = copy
        model.register_load_state_dict_post_hook(lambda module, keys: self.refresh_compute_copies())
        return copies

    @torch.no_grad()
    def refresh_compute_copies(self):
        """Rewrite the bf16 copies from the weights: after changing the weights other than by step() or
        the model's load_state_dict (step() keeps them in step itself)."""
        if self.compute_copies:
            torch._foreach_copy_(self.compute_copies, self.params)

    # -------------------------------------------------------------- the step

    @torch.no_grad()
    def step(self):
        """One update from the parameters' .grad (a parameter without one keeps its value and moments; its
        EMA still follows it). No host sync, no allocation: capturable."""
        grads = [p.grad for p in self.params]
        ops.multi_tensor_adamw_(self.params, grads, self.exp_avgs, self.exp_avg_sqs, self.emas, self.scalars,
                                shadows=self.compute_copies or None, decay=self.decay, **self.options)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    # The device scalars, as 0-d views of `scalars` (reading one as a number syncs with the GPU).
    loss_scale = _Slot("loss_scale", "the scale the next backward's gradients must carry (1 without one)")
    lr = _Slot("lr", "the LR the last step took")
    grad_norm = _Slot("grad_norm", "the last step's global gradient norm, unscaled, before clipping")
    steps_taken = _Slot("step", "updates taken (steps skipped for inf/NaN not counted)")
    steps_skipped = _Slot("skipped", "steps skipped for an inf/NaN gradient norm")

    def scale(self, loss):
        """loss times the current loss scale (for fp16 with loss_scale="dynamic")."""
        return loss * self.loss_scale.to(loss.dtype)

    # ---------------------------------------------------------------- EMA

    def ema_state_dict(self, model):
        """model.state_dict() with each trainable tensor replaced by its EMA (for a checkpoint's "ema", as
        DiT saves its EMA model's state dict); model is the one this optimizer was made from (or its
        wrapper: the names are the model's own, without DDP's or torch.compile's prefix)."""
        _check(self.has_ema, "ema_decay", "this optimizer keeps no EMA (ema_decay=None)")
        ema = dict(zip(self.names, self.emas))
        out = _unwrapped(model).state_dict()
        missing = [n for n in self.names if n not in out]
        _check(not missing, "ema_state_dict", f"the model has no parameters {missing[:3]}: pass the one "
               "DeviceAdamW was made from")
        return {k: ema.get(k, v) for k, v in out.items()}

    @torch.no_grad()
    def copy_ema_to(self, module):
        """Copy the EMA weights into module's parameters of the same names (e.g. DiT's `ema` model)."""
        _check(self.has_ema, "ema_decay", "this optimizer keeps no EMA (ema_decay=None)")
        own = dict(_unwrapped(module).named_parameters())
        missing = [n for n in self.names if n not in own]
        _check(not missing, "copy_ema_to", f"the module has no parameters {missing[:3]}")
        torch._foreach_copy_([own[n] for n in self.names], self.emas)

    # ----------------------------------------------------------- checkpoints

    def state_dict(self):
        """The moments, EMA and scalars (device tensors) and the options, keyed by parameter name."""
        return {"names": list(self.names), "exp_avg": list(self.exp_avgs), "exp_avg_sq": list(self.exp_avg_sqs),
                "ema": list(self.emas), "scalars": self.scalars, "options": dict(self.options)}

    @torch.no_grad()
    def load_state_dict(self, state):
        """Copy a state_dict() in place (the tensors a captured step reads keep their addresses). The names
        and shapes must match; the options are this optimizer's own (the schedule may change on resume)."""
        for key in ("names", "exp_avg", "exp_avg_sq", "ema", "scalars"):
            _check(key in state, "load_state_dict", f"no {key!r} in the state")
        _check(list(state["names"]) == self.names, "load_state_dict",
               "the state is of other parameters (names differ)")
        _check(bool(state["ema"]) == self.has_ema, "load_state_dict",
               "the state " + ("has" if state["ema"] else "has no") + " EMA, this optimizer "
               + ("keeps one" if self.has_ema else "none"))
        _check(tuple(state["scalars"].shape) == tuple(self.scalars.shape), "load_state_dict",
               f"scalars of shape {list(state['scalars'].shape)}, expected {list(self.scalars.shape)}")
        for key, own in (("exp_avg", self.exp_avgs), ("exp_avg_sq", self.exp_avg_sqs), ("ema", self.emas)):
            for name, dst, src in zip(self.names, own, state[key]):
                _check(tuple(src.shape) == tuple(dst.shape), "load_state_dict",
                       f"{key} of {name} has shape {list(src.shape)}, expected {list(dst.shape)}")
                dst.copy_(src)
        self.scalars.copy_(state["scalars"])
        self.refresh_compute_copies()
