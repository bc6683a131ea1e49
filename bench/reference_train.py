#!/usr/bin/env python3
"""perftrain's training recipe in plain PyTorch: the parity reference (docs/guide/training.md, "Parity with
plain PyTorch").

It trains bench/reference_dit.py's DiT (facebookresearch/DiT's model and names) on Fashion-MNIST with the
recipe a perftrain config describes, read from the config itself (`perftrain config ... > run.toml`, or a
run's config.toml), so both sides train from one set of values:
  - data: the idx files of data.path, 28x28 padded to 32x32 with -1 and scaled to [-1, 1]; batches of
    train.batch_size x train.accumulate rows in perftrain's own order (data/batch_loader.h: each epoch a
    Fisher-Yates permutation driven by splitmix64 from (train.seed, epoch), batches running across epochs);
  - objective: DDPM as DiT trains it (linear betas 1e-4..0.02 over 1000 steps, t uniform, eps-MSE, with
    model.learn_sigma the hybrid loss: MSE plus the variational bound on the variance, eps detached there);
    label dropout model.class_dropout inside the model (DiT's LabelEmbedder);
  - optimizer: AdamW (fused on a GPU) with perftrain's weight-decay groups (train/weight_decay.h: matrix
    weights only unless train.decay_all), the LR schedule of train.lr_schedule with its warm-up as a
    LambdaLR stepped every iteration (kernels/optimizer_schedule.h's closed forms), gradient clipping
    (torch.nn.utils.clip_grad_norm_), accumulation (each micro-batch's loss / accumulate);
  - EMA: a copy of the model, decay min(ema_decay, (1+v)/(10+v)) (ema_warmup) after ema_start copies;
  - precision: bf16 autocast on CUDA (train.precision auto or bf16), fp32 with TF32 products (fp32).
Random draws (initial weights, t, noise, dropout) follow train.seed through torch's generators: the same
distributions as perftrain's, not the same numbers.

Subcommands:
  train   --config C.toml --out EMA.safetensors [--metrics M.jsonl] [--device cuda|cpu]
          writes the EMA weights (fp32, DiT's state_dict names, the config in the metadata under
          perftrain.config), which `perftrain sample --ckpt` and `perftrain eval --ckpt` read as they are
  batches --config C.toml --count K --out B.safetensors
          the first K step batches (x float32 [K*rows, 1, 32, 32], y int64 [K*rows]) as training takes them,
          to compare with perftrain's loader (tests/data/reference_order_test.cpp)
"""
import argparse
import copy
import gzip
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_dit import DiT  # noqa: E402


def fail(msg):
    print(f"reference_train.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------
# The config: the keys this reference reproduces, the rest refused by name
# ----------------------------------------------------------------------------


def parse_toml(text):
    """TOML by tomllib (Python 3.11+); on an older Python the flat form perftrain writes (`[section]`, then
    `key = value` lines: 'literal' strings, and what JSON reads: "strings", numbers, true/false)."""
    try:
        import tomllib
        return tomllib.loads(text)
    except ImportError:
        pass
    cfg, section = {}, None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = cfg.setdefault(line[1:-1].strip(), {})
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep or section is None:
            raise ValueError(f"line {number}: not a key = value line of a [section]")
        literal = len(value) >= 2 and value[0] == value[-1] == "'"  # a TOML literal string: no escapes
        section[key] = value[1:-1] if literal else json.loads(value)
    return cfg


def load_config(path, training=True):
    """The perftrain config at path (a resolved one: every key present) as a dict of sections; the recipe
    it describes checked to be one this reference reproduces (training), or its data alone."""
    try:
        with open(path, "rb") as f:
            text = f.read()
        cfg = parse_toml(text.decode())
    except OSError as e:
        fail(f"--config {path}: {e.strerror}")
    except ValueError as e:  # tomllib.TOMLDecodeError, UnicodeDecodeError and json's errors are ValueErrors
        fail(f"--config {path}: not a TOML file ({e})")
    want = {"model": ["family", "depth", "hidden", "heads", "patch", "mlp_ratio", "image_size", "in_channels",
                      "num_classes", "class_dropout", "learn_sigma"],
            "data": ["source", "path"],
            "train": ["steps", "batch_size", "accumulate", "lr", "weight_decay", "decay_all", "beta1", "beta2", "eps",
                      "warmup_steps", "lr_schedule", "lr_min", "decay_fraction", "grad_clip", "ema_decay",
                      "ema_warmup", "ema_start", "seed", "precision"],
            "diffusion": ["objective"],
            "log": ["every"]}
    for section, keys in want.items():
        for key in keys:
            if key not in cfg.get(section, {}):
                fail(f"--config {path}: no {section}.{key} (pass a resolved config: `perftrain config ... > {path}`)")
    refuse = [("data.source", cfg["data"]["source"], ("fashion-mnist",))]
    if training:
        refuse += [("model.family", cfg["model"]["family"], ("dit",)),
                   ("diffusion.objective", cfg["diffusion"]["objective"], ("ddpm",)),
                   ("train.precision", cfg["train"]["precision"], ("auto", "bf16", "fp32"))]
    for key, value, allowed in refuse:
        if value not in allowed:
            fail(f"--config {path}: {key} = {value!r} is not reproduced here (only {', '.join(allowed)})")
    if cfg["model"]["in_channels"] != 1 or cfg["model"]["image_size"] != 32:
        fail(f"--config {path}: Fashion-MNIST needs model.in_channels = 1 and model.image_size = 32")
    cfg["_text"] = text.decode()
    return cfg


# ----------------------------------------------------------------------------
# Data: Fashion-MNIST in perftrain's order
# ----------------------------------------------------------------------------

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    """splitmix64's finalizer."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def epoch_permutation(n, seed, epoch):
    """data/batch_loader.h's epoch_permutation: Fisher-Yates driven by splitmix64 from (seed, epoch), each
    draw uniform in [0, b) by rejection."""
    state = mix((seed & M64) ^ mix((epoch + GOLDEN) & M64))
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        threshold = ((1 << 64) - bound) % bound
        while True:
            state = (state + GOLDEN) & M64
            r = mix(state)
            if r >= threshold:
                break
        j = r % bound
        p[i], p[j] = p[j], p[i]
    return p


class StepOrder:
    """The sample indices of each optimizer step: rows at a time from the epoch permutations, running on
    across epoch boundaries, as perftrain's BatchLoader gives them."""

    def __init__(self, n, rows, seed):
        self.n, self.rows, self.seed = n, rows, seed
        self.epoch, self.index = 0, 0
        self.perm = epoch_permutation(n, seed, 0)

    def next(self):
        out = np.empty(self.rows, dtype=np.int64)
        for j in range(self.rows):
            if self.index == self.n:
                self.epoch, self.index = self.epoch + 1, 0
                self.perm = epoch_permutation(self.n, self.seed, self.epoch)
            out[j] = self.perm[self.index]
            self.index += 1
        return out


def read_idx(directory, stem):
    """<dir>/<stem>.gz as Debian ships it, else <dir>/<stem>: the idx array as uint8 numpy."""
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with (gzip.open if name.endswith(".gz") else open)(path, "rb") as f:
                raw = f.read()
            break
    else:
        fail(f"data.path {directory} has no {stem}[.gz]")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        fail(f"{path}: not an idx file of unsigned bytes")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != math.prod(dims):
        fail(f"{path}: {data.size} bytes of data for dims {list(dims)}")
    return data.reshape(dims)


def load_fashion_mnist(directory, device):
    """The training set: uint8 images [N, 28, 28] and int64 labels [N], on `device`."""
    images = read_idx(directory, "train-images-idx3-ubyte")
    labels = read_idx(directory, "train-labels-idx1-ubyte")
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != (images.shape[0],):
        fail(f"data.path {directory}: images {list(images.shape)} and labels {list(labels.shape)} are not "
             f"[N, 28, 28] and [N]")
    return (torch.from_numpy(images.copy()).to(device),
            torch.from_numpy(labels.astype(np.int64)).to(device))


def to_model_input(pixels):
    """uint8 [B, 28, 28] -> float32 [B, 1, 32, 32]: x * 2/255 - 1, padded by 2 with the background -1."""
    x = pixels.float().mul_(2.0 / 255.0).sub_(1.0)
    return F.pad(x, (2, 2, 2, 2), value=-1.0).unsqueeze(1)


# ----------------------------------------------------------------------------
# The objective: DDPM with DiT's linear schedule, eps-MSE (+ the VLB when the variance is learnt)
# ----------------------------------------------------------------------------


class Diffusion:
    """guided-diffusion's GaussianDiffusion tables (float64, kept as float32 on the device) and its
    training loss for eps prediction with LEARNED_RANGE variance (DiT's hybrid loss)."""

    def __init__(self, device, num_timesteps=1000):
        betas = np.linspace(1e-4, 0.02, num_timesteps, dtype=np.float64)
        acp = np.cumprod(1.0 - betas)
        acp_prev = np.append(1.0, acp[:-1])
        post_var = betas * (1.0 - acp_prev) / (1.0 - acp)
        tables = {
            "sqrt_acp": np.sqrt(acp), "sqrt_1m_acp": np.sqrt(1.0 - acp),
            "sqrt_recip_acp": np.sqrt(1.0 / acp), "sqrt_recipm1_acp": np.sqrt(1.0 / acp - 1.0),
            "log_betas": np.log(betas),
            "post_log_var": np.log(np.append(post_var[1], post_var[1:])),
            "post_c1": betas * np.sqrt(acp_prev) / (1.0 - acp),
            "post_c2": (1.0 - acp_prev) * np.sqrt(1.0 - betas) / (1.0 - acp),
        }
        self.num_timesteps = num_timesteps
        self.t = {k: torch.from_numpy(v).float().to(device) for k, v in tables.items()}

    def at(self, name, t):
        return self.t[name][t].view(-1, 1, 1, 1)

    def q_sample(self, x0, t, noise):
        return self.at("sqrt_acp", t) * x0 + self.at("sqrt_1m_acp", t) * noise

    def loss(self, model, x0, y, amp_dtype, learn_sigma):
        """(loss, mse, vb) of one batch: t then noise drawn, the model under autocast, the loss in float32."""
        t = torch.randint(0, self.num_timesteps, (x0.shape[0],), device=x0.device)
        noise = torch.randn_like(x0)
        x_t = self.q_sample(x0, t, noise)
        with torch.autocast(x0.device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            out = model(x_t, t, y)
        mse, vb = self.terms(out.float(), x0, x_t, noise, t, learn_sigma)
        if vb is None:
            return mse.mean(), mse.mean().detach(), None
        return (mse + vb).mean(), mse.mean().detach(), vb.mean().detach()

    def terms(self, out, x0, x_t, noise, t, learn_sigma):
        """Per sample [B]: the eps-MSE, and with learn_sigma the VLB of the variance half (eps detached), else None."""
        c = x0.shape[1]
        eps = out[:, :c]
        mse = (noise - eps).square().flatten(1).mean(1)
        return mse, self.vb_terms_bpd(eps.detach(), out[:, c:], x0, x_t, t) if learn_sigma else None

    def vb_terms_bpd(self, eps, v, x0, x_t, t):
        """KL(q(x_{t-1}|x_t,x0) || p(x_{t-1}|x_t)) in bits/dim for t > 0, the decoder NLL at t = 0."""
        c1, c2 = self.at("post_c1", t), self.at("post_c2", t)
        min_log, max_log = self.at("post_log_var", t), self.at("log_betas", t)
        true_mean = c1 * x0 + c2 * x_t
        pred_x0 = self.at("sqrt_recip_acp", t) * x_t - self.at("sqrt_recipm1_acp", t) * eps
        model_mean = c1 * pred_x0 + c2 * x_t
        frac = (v + 1) / 2
        model_log_var = frac * max_log + (1 - frac) * min_log
        kl = normal_kl(true_mean, min_log, model_mean, model_log_var).flatten(1).mean(1)
        nll = -discretized_gaussian_log_likelihood(x0, model_mean, 0.5 * model_log_var).flatten(1).mean(1)
        return torch.where(t == 0, nll, kl) / math.log(2.0)


def normal_kl(mean1, logvar1, mean2, logvar2):
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def approx_standard_normal_cdf(x):
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    centered = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = cdf_plus.clamp(min=1e-12).log()
    log_one_minus_cdf_min = (1.0 - cdf_min).clamp(min=1e-12).log()
    log_cdf_delta = (cdf_plus - cdf_min).clamp(min=1e-12).log()
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta))


# ----------------------------------------------------------------------------
# Optimizer, schedules, EMA
# ----------------------------------------------------------------------------


def decays(name, param):
    """train/weight_decay.h: matrix weights decay; biases, norms, embedding tables and adaLN layers do not."""
    if param.dim() < 2:
        return False
    for part in name.split("."):
        if "norm" in part or "adaLN" in part or "embedding" in part or part == "pos_embed" or part.endswith("_embed"):
            return False
    return True


def lr_at(tr, step):
    """kernels/optimizer_schedule.h's lr_at for optimizer step `step` (1, 2, ...)."""
    base, low, w, total = tr["lr"], tr["lr_min"], float(tr["warmup_steps"]), float(tr["steps"])
    if tr["warmup_steps"] > 0 and step < w:
        return base * step / w
    shape = tr["lr_schedule"]
    if shape == "constant":
        return base
    if shape in ("cosine", "linear"):
        t = min(max((step - w) / (total - w), 0.0), 1.0) if total > w else 1.0
        return low + (base - low) * (0.5 * (1.0 + math.cos(math.pi * t)) if shape == "cosine" else 1.0 - t)
    start = max(w, total - tr["decay_fraction"] * total)  # wsd
    if step <= start:
        return base
    u = min(max((step - start) / (total - start), 0.0), 1.0) if total > start else 1.0
    return low + (base - low) * (1.0 - math.sqrt(u))


def ema_decay_at(tr, update):
    """kernels/optimizer_schedule.h's ema_decay_at for update `update` (0, 1, ...)."""
    if update < tr["ema_start"]:
        return 0.0
    v = update - tr["ema_start"]
    return min(tr["ema_decay"], (1.0 + v) / (10.0 + v)) if tr["ema_warmup"] else tr["ema_decay"]


def make_optimizer(model, tr, cuda):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decayed = [p for n, p in named if tr["decay_all"] or decays(n, p)]
    other = [p for n, p in named if not (tr["decay_all"] or decays(n, p))]
    groups = [{"params": decayed, "weight_decay": tr["weight_decay"]}, {"params": other, "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]),
                            eps=tr["eps"], **({"fused": True} if cuda else {}))
    # LambdaLR sets the lr of step k + 1 before optimizer step k + 1 (k = 0, 1, ...).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_at(tr, k + 1) / tr["lr"])
    return opt, sched


# ----------------------------------------------------------------------------
# safetensors (written here: the reference needs no package beyond torch and numpy)
# ----------------------------------------------------------------------------

DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def save_safetensors(tensors, path, metadata):
    """tensors (name -> float32 or int64 tensor) as a safetensors file, written to a temporary file and
    renamed, so that a failed run leaves nothing half-written."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        blob = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            for blob in blobs:
                f.write(blob)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        fail(f"--out {path}: {e.strerror}")


# ----------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------


def pick_device(name):
    if name == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is available")
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def build_model(m):
    return DiT(input_size=m["image_size"], patch_size=m["patch"], in_channels=m["in_channels"],
               hidden_size=m["hidden"], depth=m["depth"], num_heads=m["heads"], mlp_ratio=m["mlp_ratio"],
               class_dropout_prob=m["class_dropout"], num_classes=m["num_classes"], learn_sigma=m["learn_sigma"])


def amp_dtype_of(cfg, dev):
    """bf16 autocast on CUDA for precision auto/bf16; None (fp32, TF32 products on CUDA) otherwise."""
    precision = cfg["train"]["precision"]
    if precision == "bf16" and dev.type != "cuda":
        fail("train.precision = bf16 needs a CUDA device; use fp32 (or auto) on the CPU")
    return torch.bfloat16 if dev.type == "cuda" and precision in ("auto", "bf16") else None


def cmd_train(args):
    cfg = load_config(args.config)
    m, tr = cfg["model"], cfg["train"]
    dev = pick_device(args.device)
    cuda = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    amp_dtype = amp_dtype_of(cfg, dev)
    torch.manual_seed(tr["seed"])
    images, labels = load_fashion_mnist(cfg["data"]["path"], dev)
    if int(labels.max()) >= m["num_classes"]:
        fail(f"dataset has labels up to {int(labels.max())} but model.num_classes = {m['num_classes']}")
    model = build_model(m).to(dev).train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    ema_params = [q for q, p in zip(ema.parameters(), model.parameters()) if p.requires_grad]
    opt, sched = make_optimizer(model, tr, cuda)
    diffusion = Diffusion(dev)
    accumulate, rows = tr["accumulate"], tr["batch_size"]
    order = StepOrder(images.shape[0], rows * accumulate, tr["seed"])
    metrics = open(args.metrics, "w") if args.metrics else None
    every = max(1, cfg["log"]["every"])
    window = torch.zeros(3, device=dev)  # loss, mse, vb summed over the window
    t_window = time.perf_counter()
    print(f"reference_train.py: DiT depth {m['depth']} hidden {m['hidden']} patch {m['patch']} on {dev}, "
          f"{'bf16 autocast' if amp_dtype else 'fp32'}, {tr['steps']} steps of {rows} x {accumulate}", flush=True)
    for step in range(1, tr["steps"] + 1):
        idx = torch.from_numpy(order.next()).to(dev)
        x0, y = to_model_input(images[idx]), labels[idx]
        for k in range(accumulate):
            part = slice(k * rows, (k + 1) * rows)
            loss, mse, vb = diffusion.loss(model, x0[part], y[part], amp_dtype, m["learn_sigma"])
            (loss / accumulate).backward()
            with torch.no_grad():
                terms = [loss.detach(), mse, vb if vb is not None else torch.zeros_like(mse)]
                window += torch.stack(terms) / accumulate
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"]) if tr["grad_clip"] > 0 else None
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            d = ema_decay_at(tr, step - 1)
            torch._foreach_lerp_(ema_params, params, 1.0 - d)  # ema = d * ema + (1 - d) * param
        if step % every == 0 or step == tr["steps"]:
            n = every if step % every == 0 else step % every
            loss_m, mse_m, vb_m = (window / n).tolist()  # one host sync per window
            dt = time.perf_counter() - t_window
            record = {"step": step, "loss": loss_m, "mse": mse_m, "lr": lr, "steps_per_s": n / dt,
                      "images_per_s": n * rows * accumulate / dt, "epoch": order.epoch}
            if m["learn_sigma"]:
                record["vb"] = vb_m
            if grad_norm is not None:
                record["grad_norm"] = float(grad_norm)
            if not math.isfinite(loss_m):
                fail(f"loss became {loss_m} in the steps up to {step}")
            print(f"step {step}/{tr['steps']} loss {loss_m:.4f} lr {lr:.3g} {n / dt:.2f} steps/s", flush=True)
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            window.zero_()
            t_window = time.perf_counter()
    state = {k: v.float() for k, v in ema.state_dict().items()}
    save_safetensors(state, args.out,
                     {"perftrain.config": cfg["_text"], "perftrain.source": "bench/reference_train.py"})
    print(f"wrote {args.out}: EMA weights, {len(state)} tensors")


def cmd_batches(args):
    cfg = load_config(args.config, training=False)
    tr = cfg["train"]
    if args.count < 1:
        fail("--count must be >= 1")
    images, labels = load_fashion_mnist(cfg["data"]["path"], torch.device("cpu"))
    order = StepOrder(images.shape[0], tr["batch_size"] * tr["accumulate"], tr["seed"])
    idx = torch.from_numpy(np.concatenate([order.next() for _ in range(args.count)]))
    save_safetensors({"x": to_model_input(images[idx]), "y": labels[idx]}, args.out, {})
    print(f"wrote {args.out}: {args.count} step batches of {tr['batch_size'] * tr['accumulate']} rows")


def make_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("train", help="train with the config's recipe, write the EMA weights")
    s.add_argument("--config", required=True, help="a resolved perftrain config (perftrain config ... > C.toml)")
    s.add_argument("--out", required=True, help="the EMA weights to write (.safetensors)")
    s.add_argument("--metrics", help="a metrics.jsonl to write: one line per log.every steps, as perftrain's")
    s.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda if available")
    s.set_defaults(func=cmd_train)
    s = sub.add_parser("batches", help="write the first step batches in training order")
    s.add_argument("--config", required=True)
    s.add_argument("--count", type=int, required=True, help="step batches")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_batches)
    return p


if __name__ == "__main__":
    parsed = make_parser().parse_args()
    parsed.func(parsed)
